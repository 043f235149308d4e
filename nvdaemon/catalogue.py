"""HELP texts of the internal metric catalogue, one line each with the unit.

Names, devices, label keys, units and TYPEs of the Go agent's series are its catalogue exactly
(``nodevitals-contract.md`` §2, held by ``tests/collectors/test_contract.py``): a dashboard or rule written for
nodevitals works unchanged. Counters are exactly the series whose name ends in ``_total`` outside the smart tier;
every smart-tier series is a gauge, as in Go (``nvme_bytes_read_total`` included), and no ``_total`` is ever
appended to a name.

Quantities the Go agent does not have keep names of their own (``load5``, ``cpu_iowait_pct``, ``mem_used_pct``,
``net_rx_packets_total``, ``disk_io_time_seconds_total``, ``temp_crit_celsius``, ``voltage_volts``,
``hwmon_sensor_info``, ``smart_device_info``, ...) and follow the device strings of their family: every
memory-family series (swap included) has device ``mem``, so a panel filtering ``device="mem"`` sees them all; hwmon
series have device ``hwmonN/<name>/<sensor>``. Labels are added only on series of our own (``hwmon_sensor_info``
carries a sensor's label text, ``smart_device_info`` a disk's model, serial and firmware), never on a Go series.

HELP texts are ours (the Go agent writes ``nodevitals hardware metric <metric>``): they say what and in which unit.
"""

from __future__ import annotations

HELP: dict[str, str] = {
    # loadavg
    "load1": "1-minute load average (/proc/loadavg).",
    "load5": "5-minute load average (/proc/loadavg).",
    "load15": "15-minute load average (/proc/loadavg).",
    "procs_running": "Runnable scheduling entities (/proc/loadavg).",
    "procs_existing": "Scheduling entities (threads) that exist (/proc/loadavg).",
    # cpu
    "cpu_util_pct": "CPU busy time over the last interval, percent (/proc/stat).",
    "cpu_iowait_pct": "CPU time waiting for I/O over the last interval, percent (/proc/stat).",
    "cpu_steal_pct": "CPU time stolen by the hypervisor over the last interval, percent (/proc/stat).",
    "cpu_context_switches_total": "Context switches since boot (/proc/stat ctxt).",
    "cpu_interrupts_total": "Interrupts serviced since boot (/proc/stat intr).",
    "procs_forked_total": "Processes and threads created since boot (/proc/stat processes).",
    "cpus_online": "Online CPUs seen in /proc/stat.",
    # memory
    "mem_total_bytes": "Usable RAM in bytes (/proc/meminfo MemTotal).",
    "mem_free_bytes": "Unused RAM in bytes (/proc/meminfo MemFree).",
    "mem_available_bytes": "RAM available for new work without swapping, bytes (/proc/meminfo MemAvailable).",
    "mem_buffers_bytes": "Block device buffers in bytes (/proc/meminfo Buffers).",
    "mem_cached_bytes": "Page cache in bytes (/proc/meminfo Cached).",
    "mem_used_bytes": "RAM in use, bytes: MemTotal - MemAvailable (/proc/meminfo).",
    "mem_used_pct": "RAM in use, percent: 100*(MemTotal-MemAvailable)/MemTotal.",
    "mem_dirty_bytes": "Memory waiting to be written back to disk, bytes (/proc/meminfo Dirty).",
    "mem_hardware_corrupted_bytes": "RAM taken offline after hardware errors, bytes (/proc/meminfo HardwareCorrupted).",
    "swap_total_bytes": "Swap space in bytes (/proc/meminfo SwapTotal).",
    "swap_free_bytes": "Unused swap in bytes (/proc/meminfo SwapFree).",
    "swap_used_bytes": "Swap in use, bytes: SwapTotal - SwapFree (/proc/meminfo).",
    # netdev
    "net_rx_bytes_total": "Bytes received (/proc/net/dev).",
    "net_tx_bytes_total": "Bytes sent (/proc/net/dev).",
    "net_rx_packets_total": "Packets received (/proc/net/dev).",
    "net_tx_packets_total": "Packets sent (/proc/net/dev).",
    "net_rx_errors_total": "Receive errors (/proc/net/dev).",
    "net_tx_errors_total": "Transmit errors (/proc/net/dev).",
    "net_rx_dropped_total": "Received packets dropped (/proc/net/dev).",
    "net_tx_dropped_total": "Packets dropped on transmit (/proc/net/dev).",
    # diskstats
    "disk_read_bytes_total": "Bytes read from the device or partition (/proc/diskstats sectors x 512).",
    "disk_write_bytes_total": "Bytes written to the device or partition (/proc/diskstats sectors x 512).",
    "disk_read_ios_total": "Reads completed (/proc/diskstats).",
    "disk_write_ios_total": "Writes completed (/proc/diskstats).",
    "disk_read_time_seconds_total": "Seconds spent reading (/proc/diskstats).",
    "disk_write_time_seconds_total": "Seconds spent writing (/proc/diskstats).",
    "disk_io_time_seconds_total": "Seconds the device had I/O in flight (/proc/diskstats).",
    "disk_io_in_progress": "I/Os currently in flight (/proc/diskstats).",
    # hwmon
    "temp_celsius": "Sensor temperature, degrees Celsius (hwmon tempN_input).",
    "temp_crit_celsius": "Sensor critical temperature limit, degrees Celsius (hwmon tempN_crit).",
    "fan_rpm": "Fan speed, revolutions per minute (hwmon fanN_input).",
    "voltage_volts": "Voltage, volts (hwmon inN_input).",
    "power_watts": "Power draw, watts (hwmon powerN_input or powerN_average).",
    "current_amps": "Current, amperes (hwmon currN_input).",
    "hwmon_sensor_info": "1 per hwmon sensor with a label file; label = its text (hwmon *_label).",
    # pressure
    "psi_stall_ratio_avg10": "Share of time tasks stalled on the resource, 10 s average, percent (/proc/pressure).",
    "psi_stall_ratio_avg60": "Share of time tasks stalled on the resource, 60 s average, percent (/proc/pressure).",
    "psi_stall_ratio_avg300": "Share of time tasks stalled on the resource, 300 s average, percent (/proc/pressure).",
    "psi_stall_seconds_total": "Total time tasks stalled on the resource, seconds (/proc/pressure total).",
    # rapl
    "power_energy_joules_total": "Energy consumed by the RAPL zone, joules (powercap energy_uj).",
    # pcie aer
    "pcie_aer_correctable_total": "PCIe AER correctable errors of the device by error_type (aer_dev_correctable).",
    "pcie_aer_nonfatal_total": "PCIe AER uncorrectable non-fatal errors by error_type (aer_dev_nonfatal).",
    "pcie_aer_fatal_total": "PCIe AER uncorrectable fatal errors by error_type (aer_dev_fatal).",
    # smart (pySMART over smartctl --all; all gauges, no labels but smart_device_info's)
    "smart_temperature_celsius": "Disk temperature, degrees Celsius (ATA 190/194, NVMe composite).",
    "smart_power_on_hours": "Hours the disk has been powered on (ATA 9, NVMe Power On Hours).",
    "smart_power_cycles": "Power-on cycles of the disk (ATA 12, NVMe Power Cycles).",
    "smart_reallocated_sectors": "Sectors the disk has remapped to spares (ATA 5 raw).",
    "smart_reported_uncorrectable": "Errors the disk could not correct with ECC (ATA 187 raw).",
    "smart_command_timeout": "Commands aborted by a disk timeout (ATA 188 raw, first count).",
    "smart_pending_sectors": "Unstable sectors waiting to be remapped (ATA 197 raw).",
    "smart_offline_uncorrectable": "Sectors the offline scan could not read (ATA 198 raw).",
    "smart_health_passed": "1 if SMART overall health passed (ATA pre-fail thresholds, NVMe critical warning 0).",
    "smart_error_log_count": "Errors in the disk's ATA SMART error log (ATA Error Count).",
    "smart_capacity_bytes": "User capacity of the disk (or NVMe namespace 1), bytes.",
    "smart_logical_block_size_bytes": "Logical block (sector) size of the disk, bytes.",
    "smart_rotation_rate_rpm": "Spindle speed of a rotating disk, revolutions per minute (absent on solid state).",
    "smart_interface_speed_bits_per_second": "Current SATA link speed, bits per second.",
    "smart_device_info": "1 per disk read; labels model, serial and firmware as smartctl reports them.",
    "nvme_percentage_used": "Vendor estimate of the NVMe endurance used, percent (may exceed 100).",
    "nvme_available_spare": "Remaining NVMe spare capacity, percent.",
    "nvme_available_spare_threshold": "NVMe spare capacity below which the controller warns, percent.",
    "nvme_media_errors": "Unrecovered data integrity errors of the NVMe controller (Media and Data Integrity Errors).",
    "nvme_critical_warning": "NVMe critical warning bits: 0x01 spare, 0x02 temperature, 0x04 reliability, 0x08 RO.",
    "nvme_bytes_read_total": "Bytes read from the NVMe controller (Data Units Read x 512000).",
    "nvme_bytes_written_total": "Bytes written to the NVMe controller (Data Units Written x 512000).",
    "nvme_error_log_entries": "Error Information log entries over the NVMe controller's life.",
    # gpu (NVML)
    "gpu_utilization_pct": "Share of time a kernel ran on the GPU over NVML's sample period, percent.",
    "gpu_mem_copy_util_pct": "Share of time device memory was read or written over NVML's sample period, percent.",
    "gpu_encoder_util_pct": "Video encoder utilisation, percent (NVML).",
    "gpu_decoder_util_pct": "Video decoder utilisation, percent (NVML).",
    "gpu_mem_used_bytes": "Framebuffer memory in use, bytes (NVML).",
    "gpu_mem_free_bytes": "Framebuffer memory free, bytes (NVML).",
    "gpu_mem_total_bytes": "Framebuffer memory installed, bytes (NVML).",
    "gpu_mem_reserved_bytes": "Framebuffer memory reserved by the driver and firmware, bytes (NVML).",
    "gpu_temperature_celsius": "GPU core temperature, degrees Celsius (NVML).",
    "gpu_memory_temperature_celsius": "GPU memory (HBM) temperature, degrees Celsius (NVML).",
    "gpu_power_watts": "Power draw of the GPU board, watts (NVML).",
    "gpu_energy_joules_total": "Energy consumed by the GPU since the driver loaded, joules (NVML).",
    "gpu_sm_clock_mhz": "SM clock, MHz (NVML).",
    "gpu_mem_clock_mhz": "Memory clock, MHz (NVML).",
    "gpu_throttle_reasons": "Raw NVML clocks event (throttle) reasons bitmask.",
    "gpu_throttle_active": "1 while the GPU is slowed for this non-benign reason (NVML clocks event reasons).",
    "gpu_ecc_corrected_total": "Corrected ECC errors, aggregate over the GPU's life (NVML).",
    "gpu_ecc_uncorrected_total": "Uncorrected ECC errors, aggregate over the GPU's life (NVML).",
    "gpu_pcie_replay_total": "PCIe replays (retried transfers) of the GPU (NVML).",
    "gpu_remapped_rows_corrected_total": "Memory rows remapped after correctable errors (NVML).",
    "gpu_remapped_rows_uncorrected_total": "Memory rows remapped after uncorrectable errors (NVML).",
    "gpu_row_remap_failed": "1 if a memory row remapping failed: the GPU needs service (NVML).",
    "gpu_xid_errors_total": "XID errors reported by NVML since the agent started, by XID code.",
}


def help_for(metric: str) -> str:
    return HELP.get(metric, f"Hardware metric {metric}.")
