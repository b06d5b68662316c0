"""EFA (Elastic Fabric Adapter) health from sysfs.

Data flows one way: `discovery` finds the EFA devices under <sysfs>/class/infiniband by PCI
identity, `reader` reads each device's files through a `SysfsReader` seam, `parse` turns file
text into numbers and plans which files to read, `naming` maps driver counter files to
catalog metrics; `workers` runs the reads off the collector's thread under per-device
deadlines. The collector (exporter.collectors.efa) only glues them together.
"""
