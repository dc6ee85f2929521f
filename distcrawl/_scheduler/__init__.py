"""The parts of the distributed scheduler (distcrawl/scheduler.py), each in the module that
says why it is apart: those that keep state of their own, and the bases of ``Scheduler`` in
which its batch building, its pump and its signal handlers are written. Private:
``distcrawl.scheduler`` is the component, and these names may change with it."""
