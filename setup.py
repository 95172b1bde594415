"""Package map: one import name, ``rkc``, over the folders the layout keeps at the root.

pyproject.toml holds the metadata; the package list is computed here because
setuptools' declarative ``packages.find`` cannot rename folders (ir/ -> rkc.ir), and
a hand-kept list would silently drop a new subpackage from regular wheels.
"""
from setuptools import find_packages, setup

SUBPACKAGES = ("ir", "compiler", "runtime")

packages = ["rkc"] + [f"rkc.{name}" for name in find_packages(include=[f"{root}*" for root in SUBPACKAGES])]
setup(
    packages=packages,
    package_dir={"rkc": "rkc", **{f"rkc.{root}": root for root in SUBPACKAGES}},
)
