"""The rocket patch series is well formed and consistent with its base.

Kernel sources are not in this repository, so "applies cleanly" is proved
here through the git blob ids: the pre-image ids in the patches' index
lines must be the Linux v6.18 ids recorded in kernel/patches/BASE, and each
later patch must start from the previous one's post-image.  With a kernel
tree at hand, set ROCKET_LINUX_TREE=/path/to/linux to also run
kernel/patches/check-apply against it, and to compile and run the shared
address-space code of 0004 against userspace stubs (needs gcc).
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCH_DIR = REPO / "kernel" / "patches"
PATCHES = sorted(PATCH_DIR.glob("0*.patch"))
ALLOWED_PREFIXES = ("drivers/accel/rocket/", "include/uapi/drm/")
BASE_VERSION = "Linux v6.18"


def read_base():
    base = {}
    for line in (PATCH_DIR / "BASE").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            path, blob = line.split()
            base[path] = blob
    return base


def file_diffs(text):
    """[(path, old_blob, new_blob, body)] for every file diff in a patch."""
    out = []
    parts = re.split(r"^diff --git ", text, flags=re.M)[1:]
    for part in parts:
        m = re.match(r"a/(\S+) b/(\S+)\n", part)
        assert m and m.group(1) == m.group(2), "renames are not expected: %r" % part[:80]
        idx = re.search(r"^index ([0-9a-f]{40})\.\.([0-9a-f]{40})", part, flags=re.M)
        assert idx, "%s: index line without full blob ids" % m.group(1)
        body = part.split("\n-- \n", 1)[0]  # drop the format-patch signature
        out.append((m.group(1), idx.group(1), idx.group(2), body))
    return out


def subject(text):
    """The Subject header, unfolded (format-patch wraps long ones)."""
    m = re.search(r"^Subject: (.*(?:\n[ \t].*)*)", text, re.M)
    return re.sub(r"\n[ \t]+", " ", m.group(1)) if m else None


def commit_message(text):
    head, _, rest = text.partition("\n\n")
    return rest.split("\n---\n", 1)[0]


def test_series_has_the_five_patches():
    subjects = [re.match(r"\[PATCH (\d)/(\d)\] (.*)$", subject(p.read_text()) or "")
                for p in PATCHES]
    assert all(subjects), "every patch needs a numbered Subject line"
    assert [(s.group(1), s.group(2)) for s in subjects] == [(str(n), "5") for n in range(1, 6)]
    titles = [s.group(3) for s in subjects]
    for title, word in zip(titles, ("OPP", "powered", "chain", "share one address space", "which interrupt")):
        assert word in title


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_patch_is_git_format_patch_with_a_reason(patch):
    text = patch.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert re.search(r"^From: .+", text, re.M)
    message = commit_message(text)
    assert len(message.split()) > 150, "the commit message must explain why"
    assert "Signed-off-by: " in message
    assert BASE_VERSION in message, "each patch names the kernel it is based on"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_git_apply_stat_reads_the_patch(patch, tmp_path):
    res = subprocess.run(["git", "apply", "--stat", str(patch)], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert re.search(r"\d+ files? changed", res.stdout)
    assert "0 files changed" not in res.stdout


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_patch_touches_only_rocket_and_uapi(patch):
    paths = [d[0] for d in file_diffs(patch.read_text())]
    assert paths
    for path in paths:
        assert path.startswith(ALLOWED_PREFIXES), path


def test_preimages_chain_from_the_named_base():
    base = read_base()
    current = dict(base)
    touched = set()
    for patch in PATCHES:
        for path, old, new, _ in file_diffs(patch.read_text()):
            assert path in base, "%s: %s is not listed in BASE" % (patch.name, path)
            assert old == current[path], (
                "%s: %s starts from blob %s, expected %s"
                % (patch.name, path, old, current[path]))
            current[path] = new
            touched.add(path)
    assert touched == set(base), "BASE lists files the series does not touch"


def test_added_lines_are_clean():
    for patch in PATCHES:
        for path, _, _, body in file_diffs(patch.read_text()):
            for line in body.splitlines():
                if line.startswith("+") and not line.startswith("+++"):
                    assert not line.rstrip("\n").endswith((" ", "\t")), \
                        "%s: trailing whitespace: %r" % (path, line)
                    assert not line.startswith("+" + " " * 8), \
                        "%s: indent with tabs: %r" % (path, line)


def test_uapi_change_is_additive_and_keeps_the_old_layout():
    """Existing userspace (Mesa) passes 40-byte jobs: no old line may change."""
    uapi = [d for p in PATCHES for d in file_diffs(p.read_text())
            if d[0] == "include/uapi/drm/rocket_accel.h"]
    assert len(uapi) == 2  # 0003 (flags), 0005 (irq_mask in place of reserved)
    body = uapi[0][3]
    removed = [l for l in body.splitlines() if l.startswith("-") and not l.startswith("---")]
    assert removed == []
    added = "\n".join(l[1:] for l in body.splitlines() if l.startswith("+"))
    assert "#define DRM_ROCKET_JOB_CHAIN" in added
    assert "__u32 flags;" in added and "__u32 reserved;" in added
    assert "DRM_IOCTL_VERSION" in added, "the header must say how to detect support"


def test_kernel_side_accepts_old_job_size():
    job_c = [d[3] for p in PATCHES for d in file_diffs(p.read_text())
             if d[0] == "drivers/accel/rocket/rocket_job.c"]
    diff = "\n".join(job_c)
    assert "offsetofend(struct drm_rocket_job, out_bo_handle_count)" in diff
    assert "copy_struct_from_user" in diff
    assert "-\tif (args->job_struct_size < sizeof(struct drm_rocket_job)) {" in diff


def added(body):
    return [l[1:] for l in body.splitlines() if l.startswith("+") and not l.startswith("+++")]


def removed(body):
    return [l[1:] for l in body.splitlines() if l.startswith("-") and not l.startswith("---")]


SHARED_PATCH = PATCHES[3]  # 0004, the shared address space


def shared_diffs():
    return {path: body for path, _, _, body in file_diffs(SHARED_PATCH.read_text())}


def test_shared_address_space_needs_no_uapi_and_reports_version_1_2():
    diffs = shared_diffs()
    assert set(diffs) == {"drivers/accel/rocket/rocket_drv.c", "drivers/accel/rocket/rocket_drv.h",
                          "drivers/accel/rocket/rocket_gem.c", "drivers/accel/rocket/rocket_gem.h"}
    drv = diffs["drivers/accel/rocket/rocket_drv.c"]
    assert "\t.minor\t\t\t= 1," in removed(drv) and "\t.minor\t\t\t= 2," in added(drv)
    assert "module_param(shared_vm, bool, 0644);" in added(drv)


def test_shared_address_space_moves_the_allocator_into_the_refcounted_domain():
    diffs = shared_diffs()
    header = diffs["drivers/accel/rocket/rocket_drv.h"]
    for member in ("\tstruct drm_mm mm;", "\tstruct mutex mm_lock;"):
        assert member in removed(header) and member in added(header)
    assert "\tstruct mm_struct *owner;" in added(header)
    # BOs no longer point at the file that created them: it may be closed first
    assert "\tstruct rocket_file_priv *driver_priv;" in removed(diffs["drivers/accel/rocket/rocket_gem.h"])
    gem = diffs["drivers/accel/rocket/rocket_gem.c"]
    assert "\tmutex_lock(&domain->mm_lock);" in added(gem)
    assert not [l for l in added(gem) if "driver_priv" in l or "rocket_priv->mm" in l]
    assert not [l for l in added(diffs["drivers/accel/rocket/rocket_drv.c"]) if "rocket_priv->mm" in l]


def test_shared_address_space_is_keyed_on_the_pinned_opener_mm():
    drv = added(shared_diffs()["drivers/accel/rocket/rocket_drv.c"])
    assert "\tstruct mm_struct *owner = READ_ONCE(shared_vm) ? current->mm : NULL;" in drv
    assert "\t\tmmgrab(owner);" in drv and "\t\tmmdrop(domain->owner);" in drv
    assert any("kref_put_mutex(&domain->kref" in l for l in drv), \
        "the last put must take the lookup lock, or a lookup could revive a dying domain"


def test_shared_address_space_message_says_why_how_to_detect_and_what_it_exposes():
    message = commit_message(SHARED_PATCH.read_text())
    for needed in ("absolute IOVAs", "PRIME", "current->mm", "exec()", "mmgrab()",
                   "SCM_RIGHTS", "shared_vm", "DRM_IOCTL_VERSION now reports 1.2",
                   "Mesa", "No UAPI changes"):
        assert needed in message, needed


IRQ_PATCH = PATCHES[4]  # 0005, the job-level interrupt mask


def irq_diffs():
    return {path: body for path, _, _, body in file_diffs(IRQ_PATCH.read_text())}


def test_irq_mask_takes_the_reserved_word_and_reports_version_1_3():
    diffs = irq_diffs()
    assert set(diffs) == {"drivers/accel/rocket/rocket_drv.c", "drivers/accel/rocket/rocket_job.c",
                          "drivers/accel/rocket/rocket_job.h", "include/uapi/drm/rocket_accel.h"}
    drv = diffs["drivers/accel/rocket/rocket_drv.c"]
    assert "\t.minor\t\t\t= 2," in removed(drv) and "\t.minor\t\t\t= 3," in added(drv)
    header = diffs["include/uapi/drm/rocket_accel.h"]
    # the 48-byte layout stays: only the reserved word is renamed, nothing else removed
    assert [l for l in removed(header) if l.strip() and "Reserved" not in l] == ["\t__u32 reserved;"]
    assert "\t__u32 irq_mask;" in added(header)
    assert "#define DRM_ROCKET_JOB_IRQ_MASK\t\t\t(1 << 1)" in added(header)


def test_irq_mask_is_checked_programmed_and_honoured():
    job = irq_diffs()["drivers/accel/rocket/rocket_job.c"]
    new = added(job)
    # whole-ioctl -EINVAL for a bad mask, like an unknown flag (stock: DPU only, as before)
    assert any("!rocket_job_irq_mask_valid(&jobs[i])" in l for l in new)
    assert "\treturn job->irq_mask && !(job->irq_mask & ~ROCKET_JOB_IRQ_BLOCKS);" in new
    assert "\t\t\t PC_INTERRUPT_MASK_DPU_0 | PC_INTERRUPT_MASK_DPU_1;" in new
    # each kick enables and clears the job's mask, and only an enabled bit ends it
    assert "\trocket_pc_writel(core, INTERRUPT_MASK, job->irq_mask);" in new
    assert "\trocket_pc_writel(core, INTERRUPT_CLEAR, job->irq_mask);" in new
    assert any("raw_status & rocket_pc_readl(core, INTERRUPT_MASK) & ROCKET_JOB_IRQ_BLOCKS" in l for l in new)


def test_irq_mask_message_says_why_how_to_detect_and_what_is_unverified():
    message = commit_message(IRQ_PATCH.read_text())
    for needed in ("PPU_0", "PC_INTERRUPT_RAW_STATUS", "DRM_ROCKET_JOB_IRQ_MASK", "-EINVAL", "version 1.3",
                   "Not verified on a board"):
        assert needed in message, needed


LINUX_TREE = os.environ.get("ROCKET_LINUX_TREE")
needs_tree = pytest.mark.skipif(not LINUX_TREE,
                                reason="set ROCKET_LINUX_TREE to a Linux v6.18 tree")


@needs_tree
def test_check_apply_against_a_real_tree():
    res = subprocess.run(["sh", str(PATCH_DIR / "check-apply"), LINUX_TREE],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("applies  ") == len(PATCHES) == 5


def patched_tree(dest):
    """The files in BASE from ROCKET_LINUX_TREE with the whole series applied."""
    for path in read_base():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes((Path(LINUX_TREE) / path).read_bytes())
    for patch in PATCHES:
        res = subprocess.run(["git", "apply", str(patch)], cwd=dest, capture_output=True, text=True)
        assert res.returncode == 0, patch.name + ": " + res.stderr
    return dest


def between(text, start, end_after):
    """text from the line starting `start` to the first "\n}\n"/"\n};\n" after `end_after`."""
    first = text.index(start)
    tail = text.index(end_after, first)
    close = re.compile(r"\n}\n|\n};\n").search(text, tail)
    return text[first:close.end()]


@needs_tree
def test_patched_gem_code_uses_only_the_domain_allocator(tmp_path):
    gem = (patched_tree(tmp_path) / "drivers/accel/rocket/rocket_gem.c").read_text()
    assert "driver_priv = " not in gem and "bo->driver_priv" not in gem
    assert re.findall(r"mutex_lock\(&(\S+)\);", gem) == [
        "domain->mm_lock", "rocket_priv->domain->mm_lock", "rocket_priv->domain->mm_lock"]


@needs_tree
def test_shared_domain_code_runs_against_userspace_stubs(tmp_path):
    """Compile the patched lookup/refcount code with gcc against kernel_stubs.h and run it."""
    tree = patched_tree(tmp_path / "linux")
    drv_c = (tree / "drivers/accel/rocket/rocket_drv.c").read_text()
    drv_h = (tree / "drivers/accel/rocket/rocket_drv.h").read_text()
    build = tmp_path / "build"
    build.mkdir()
    (build / "rocket_iommu_domain.h").write_text(
        between(drv_h, "struct rocket_iommu_domain {", "struct rocket_iommu_domain {"))
    (build / "domain_section.c").write_text(
        between(drv_c, "static bool shared_vm = true;", "rocket_iommu_domain_put(struct"))
    data = Path(__file__).parent / "data" / "shared_domain"
    exe = build / "shared_domain_test"
    res = subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function",
                          "-fsanitize=address,undefined", "-g", "-I", str(build), "-I", str(data),
                          "-o", str(exe), str(data / "shared_domain_test.c")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "shared domain: ok"
