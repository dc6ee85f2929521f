"""The parts of the distributed scheduler (distcrawl/scheduler.py) that keep state of their
own, each in the module that says why it is apart. Private: ``distcrawl.scheduler`` is the
component, and these names may change with it."""
