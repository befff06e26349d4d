"""The run-format contract shared with the writers (the collectors, the simulator): the run
directory's schema, the names of groups and tags, the input limits, the communication ledger, the
pipeline schedules, the fault-injection specs, the device table and the rules a job's inputs obey.
Standard library only: a training process imports it."""
