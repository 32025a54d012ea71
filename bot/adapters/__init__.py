"""One module per outside system: SSH and local executors, NVML, APScheduler, case bundle files, the
database (store/). Only services use them."""
