"""The rocket patch series is well formed and consistent with its base.

Kernel sources are not in this repository, so "applies cleanly" is proved
here through the git blob ids: the pre-image ids in the patches' index
lines must be the Linux v6.18 ids recorded in kernel/patches/BASE, and each
later patch must start from the previous one's post-image.  With a kernel
tree at hand, set ROCKET_LINUX_TREE=/path/to/linux to also run
kernel/patches/check-apply against it.
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


def test_series_has_the_three_patches():
    subjects = [re.match(r"\[PATCH (\d)/(\d)\] (.*)$", subject(p.read_text()) or "")
                for p in PATCHES]
    assert all(subjects), "every patch needs a numbered Subject line"
    assert [(s.group(1), s.group(2)) for s in subjects] == [("1", "3"), ("2", "3"), ("3", "3")]
    titles = " ".join(s.group(3) for s in subjects)
    for word in ("OPP", "powered", "chain"):
        assert word in titles


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
    assert len(uapi) == 1
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


@pytest.mark.skipif(not os.environ.get("ROCKET_LINUX_TREE"),
                    reason="set ROCKET_LINUX_TREE to a Linux v6.18 tree to run check-apply")
def test_check_apply_against_a_real_tree():
    res = subprocess.run(["sh", str(PATCH_DIR / "check-apply"),
                          os.environ["ROCKET_LINUX_TREE"]],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
