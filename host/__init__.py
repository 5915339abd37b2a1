"""The machine a process runs on: the CPUs it may use and how its threads wait."""
