"""rkc's runtime: load an .rkbin, run NPU segments on a Device (the rocket
driver or the built-in simulator) and CPU ops in numpy."""
