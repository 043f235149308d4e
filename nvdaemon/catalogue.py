"""HELP texts of the internal metric catalogue (the Go agent's names), one line each with the unit."""

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
    "mem_used_pct": "RAM in use, percent: 100*(MemTotal-MemAvailable)/MemTotal.",
    "mem_dirty_bytes": "Memory waiting to be written back to disk, bytes (/proc/meminfo Dirty).",
    "mem_hardware_corrupted_bytes": "RAM taken offline after hardware errors, bytes (/proc/meminfo HardwareCorrupted).",
    "swap_total_bytes": "Swap space in bytes (/proc/meminfo SwapTotal).",
    "swap_free_bytes": "Unused swap in bytes (/proc/meminfo SwapFree).",
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
    "disk_read_bytes_total": "Bytes read from the whole device (/proc/diskstats sectors x 512).",
    "disk_written_bytes_total": "Bytes written to the whole device (/proc/diskstats sectors x 512).",
    "disk_reads_completed_total": "Reads completed (/proc/diskstats).",
    "disk_writes_completed_total": "Writes completed (/proc/diskstats).",
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
    # pressure
    "psi_avg10_pct": "Share of time tasks stalled on the resource, 10 s average, percent (/proc/pressure).",
    "psi_avg60_pct": "Share of time tasks stalled on the resource, 60 s average, percent (/proc/pressure).",
    "psi_avg300_pct": "Share of time tasks stalled on the resource, 300 s average, percent (/proc/pressure).",
    "psi_stall_seconds_total": "Total time tasks stalled on the resource, seconds (/proc/pressure total).",
    # rapl
    "power_energy_joules_total": "Energy consumed by the RAPL zone, joules (powercap energy_uj).",
    # pcie aer
    "pcie_aer_correctable_total": "PCIe AER correctable errors of the device (aer_dev_correctable TOTAL_ERR_COR).",
    "pcie_aer_nonfatal_total": "PCIe AER uncorrectable non-fatal errors (aer_dev_nonfatal TOTAL_ERR_NONFATAL).",
    "pcie_aer_fatal_total": "PCIe AER uncorrectable fatal errors (aer_dev_fatal TOTAL_ERR_FATAL).",
    "pcie_aer_errors_total": "PCIe AER errors by severity and error type (aer_dev_* files).",
}


def help_for(metric: str) -> str:
    return HELP.get(metric, f"Hardware metric {metric}.")
