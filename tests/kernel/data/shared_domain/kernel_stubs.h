/*
 * Userspace stand-ins for the kernel APIs that the address-space code of
 * kernel/patches/0004 uses, with the semantics that code relies on: kref
 * counts, kref_put_mutex() calling the release with the mutex held, list
 * heads, guard(mutex) unlocking at scope exit, mmgrab()/mmdrop() counting.
 * Every mutex remembers whether it is held, so a release that forgets to
 * unlock, or an unlock without a lock, fails an assertion.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef uint64_t u64;

#define __releases(x)
#define GFP_KERNEL 0
#define READ_ONCE(x) (x)
#define module_param(name, type, perm)
#define MODULE_PARM_DESC(name, text)
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define ERR_PTR(err) ((void *)(intptr_t)(err))
#define PTR_ERR(ptr) ((long)(intptr_t)(ptr))
#define IS_ERR(ptr) ((uintptr_t)(ptr) >= (uintptr_t)-4095)
#define ERR_CAST(ptr) ((void *)(ptr))

static int allocations;

static void *kmalloc(size_t size, int flags)
{
	(void)flags;
	allocations++;
	return malloc(size);
}

static void kfree(void *ptr)
{
	if (ptr)
		allocations--;
	free(ptr);
}

struct list_head { struct list_head *next, *prev; };
#define LIST_HEAD(name) struct list_head name = { &(name), &(name) }

static void INIT_LIST_HEAD(struct list_head *list) { list->next = list->prev = list; }

static void list_add(struct list_head *entry, struct list_head *head)
{
	entry->next = head->next;
	entry->prev = head;
	head->next->prev = entry;
	head->next = entry;
}

static void list_del(struct list_head *entry)
{
	entry->next->prev = entry->prev;
	entry->prev->next = entry->next;
	entry->next = entry->prev = NULL;
}

#define list_for_each_entry(pos, head, member)					\
	for (pos = container_of((head)->next, __typeof__(*pos), member);	\
	     &pos->member != (head);						\
	     pos = container_of(pos->member.next, __typeof__(*pos), member))

struct mutex { int held; int initialised; };
#define DEFINE_MUTEX(name) struct mutex name = { 0, 1 }

static void mutex_init(struct mutex *lock) { lock->held = 0; lock->initialised = 1; }
static void mutex_destroy(struct mutex *lock) { assert(!lock->held); lock->initialised = 0; }
static void mutex_lock(struct mutex *lock) { assert(lock->initialised && !lock->held); lock->held = 1; }
static void mutex_unlock(struct mutex *lock) { assert(lock->held); lock->held = 0; }

static void guard_mutex_exit(struct mutex **lock) { mutex_unlock(*lock); }
static struct mutex *guard_mutex_enter(struct mutex *lock) { mutex_lock(lock); return lock; }
#define guard(type) \
	struct mutex *guard_ __attribute__((cleanup(guard_mutex_exit))) = guard_mutex_enter

struct kref { int refcount; };

static void kref_init(struct kref *kref) { kref->refcount = 1; }
static void kref_get(struct kref *kref) { assert(kref->refcount > 0); kref->refcount++; }

static int kref_put_mutex(struct kref *kref, void (*release)(struct kref *kref),
			  struct mutex *lock)
{
	assert(kref->refcount > 0);
	mutex_lock(lock);
	if (--kref->refcount == 0) {
		release(kref);
		assert(!lock->held);	/* the release must unlock */
		return 1;
	}
	mutex_unlock(lock);
	return 0;
}

struct mm_struct { int mm_count; };
static void mmgrab(struct mm_struct *mm) { mm->mm_count++; }
static void mmdrop(struct mm_struct *mm) { assert(mm->mm_count > 1); mm->mm_count--; }

struct task_struct { struct mm_struct *mm; };
static struct task_struct *current;

struct device { int unused; };
struct iommu_domain { struct { u64 aperture_start, aperture_end; } geometry; };
static int iommu_domains;

static struct iommu_domain *iommu_paging_domain_alloc(struct device *dev)
{
	struct iommu_domain *domain = calloc(1, sizeof(*domain));

	(void)dev;
	domain->geometry.aperture_end = 0xffffffffull;	/* rockchip-iommu: 32-bit IOVAs */
	iommu_domains++;
	return domain;
}

static void iommu_domain_free(struct iommu_domain *domain)
{
	iommu_domains--;
	free(domain);
}

struct drm_mm { u64 start, size; int nodes; int initialised; };

static void drm_mm_init(struct drm_mm *mm, u64 start, u64 size)
{
	mm->start = start;
	mm->size = size;
	mm->nodes = 0;
	mm->initialised = 1;
}

static void drm_mm_takedown(struct drm_mm *mm)
{
	assert(mm->initialised && mm->nodes == 0);
	mm->initialised = 0;
}
