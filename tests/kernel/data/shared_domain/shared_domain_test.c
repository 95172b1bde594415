/*
 * Runs the address-space code of kernel/patches/0004 (extracted from the
 * patched rocket_drv.c and rocket_drv.h by tests/kernel/test_kernel_patches.py)
 * against kernel_stubs.h: files of one mm share a domain, other mms, kernel
 * threads and shared_vm=0 get their own, a domain outlives its files while
 * a BO holds it and is freed (and leaves the lookup) with its last
 * reference, and every mmgrab() is balanced.
 */
#include "kernel_stubs.h"
#include "rocket_iommu_domain.h"	/* struct rocket_iommu_domain, extracted */

struct rocket_file_priv { struct rocket_iommu_domain *domain; };
struct rocket_iommu_domain *rocket_iommu_domain_get(struct rocket_file_priv *rocket_priv);
void rocket_iommu_domain_put(struct rocket_iommu_domain *domain);

#include "domain_section.c"		/* the patched functions, extracted */

int main(void)
{
	struct device dev;
	struct mm_struct mm_a = { 1 }, mm_b = { 1 };
	struct task_struct task_a = { &mm_a }, thread_a = { &mm_a }, task_b = { &mm_b };
	struct task_struct kthread = { NULL };
	struct rocket_iommu_domain *a1, *a2, *b1, *k, *private_a, *again, *fresh, *bo;
	struct rocket_file_priv file_a1;

	current = &task_a;
	a1 = rocket_iommu_domain_for_open(&dev);
	current = &thread_a;
	a2 = rocket_iommu_domain_for_open(&dev);
	assert(a1 == a2 && a1->kref.refcount == 2);
	assert(a1->owner == &mm_a && mm_a.mm_count == 2);	/* pinned once per domain */
	assert(a1->mm.start == 0 && a1->mm.size == 1ull << 32);

	current = &task_b;
	b1 = rocket_iommu_domain_for_open(&dev);
	assert(b1 != a1 && b1->owner == &mm_b && iommu_domains == 2);

	current = &kthread;
	k = rocket_iommu_domain_for_open(&dev);
	assert(k != a1 && k != b1 && k->owner == NULL && iommu_domains == 3);

	shared_vm = false;
	current = &task_a;
	private_a = rocket_iommu_domain_for_open(&dev);
	assert(private_a != a1 && private_a->owner == NULL && mm_a.mm_count == 2);
	shared_vm = true;

	/* A BO created on file a1 keeps the domain after both files close. */
	file_a1.domain = a1;
	bo = rocket_iommu_domain_get(&file_a1);
	rocket_iommu_domain_put(a1);
	rocket_iommu_domain_put(a2);
	assert(bo->kref.refcount == 1 && mm_a.mm_count == 2 && iommu_domains == 4);

	/* A new file of the same process joins it: the BO keeps its IOVA. */
	again = rocket_iommu_domain_for_open(&dev);
	assert(again == bo);
	rocket_iommu_domain_put(again);
	rocket_iommu_domain_put(bo);
	assert(mm_a.mm_count == 1 && iommu_domains == 3);

	/* Gone from the lookup: the next open makes a new domain. */
	fresh = rocket_iommu_domain_for_open(&dev);
	assert(fresh->owner == &mm_a && mm_a.mm_count == 2 && iommu_domains == 4);

	rocket_iommu_domain_put(fresh);
	rocket_iommu_domain_put(b1);
	rocket_iommu_domain_put(k);
	rocket_iommu_domain_put(private_a);
	rocket_iommu_domain_put(NULL);	/* a job that failed before taking one */
	assert(iommu_domains == 0 && allocations == 0);
	assert(mm_a.mm_count == 1 && mm_b.mm_count == 1);
	assert(rocket_shared_domains.next == &rocket_shared_domains);
	assert(!rocket_shared_domains_lock.held);
	puts("shared domain: ok");
	return 0;
}
