"""Recording fakes of vendor libraries we cannot run here. They are fakes: they record calls, they do not compute."""
