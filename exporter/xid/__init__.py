"""XIDs: the kernel log and NVML events as sources, one count per event since boot, a catalog and
policy tiers, a state file that survives restarts, and the per-GPU / node health verdict."""
