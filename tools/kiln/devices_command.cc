// `kiln devices`: lists the devices of this machine (cpu, and the sim
// devices that KILN_SIM_DEVICES configures) and whether each is attached
// now, and by whom. Probing takes a device's lock for an instant and drops
// it, so it never disturbs a running process.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "runtime/device_internal.h"
#include "runtime/device_lock.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {
namespace {

std::string transferText(const DeviceInfo& info) {
  if (info.kind == DeviceKind::kCpu) return "-";
  const std::string latency = fmt::format("{:g} us", static_cast<double>(info.transfer_latency_ns) / 1e3);
  const std::string bandwidth = info.transfer_bytes_per_second > 0
                                    ? fmt::format("{:g} GB/s", info.transfer_bytes_per_second / 1e9)
                                    : std::string("unlimited");
  return latency + ", " + bandwidth;
}

std::string attachedText(const DeviceInfo& info, const std::filesystem::path& lock_dir) {
  if (info.kind == DeviceKind::kCpu) return "shared (never locked)";
  if (!DeviceLock::isHeld(lock_dir, info.id)) return "no";
  return "by " + DeviceLock::describeHolder(lock_dir, info.id);
}

}  // namespace

Command addDevicesCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "devices", "List the devices of this machine and who has them attached (sim devices: KILN_SIM_DEVICES=N)");
  (void)cmd;
  return []() {
    const DeviceManager manager(DeviceManagerOptions::fromEnvironment());
    const std::filesystem::path& lock_dir = manager.options().lock_dir;
    const std::vector<DeviceInfo> devices = manager.devices();

    std::vector<std::vector<std::string>> rows = {{"ID", "KIND", "MEMORY", "THREADS", "TRANSFER", "ATTACHED"}};
    for (const DeviceInfo& info : devices) {
      rows.push_back({info.id, deviceKindName(info.kind), device_internal::humanBytes(info.memory_bytes),
                      std::to_string(info.compute_threads), transferText(info), attachedText(info, lock_dir)});
    }
    std::vector<size_t> widths(rows[0].size(), 0);
    for (const auto& row : rows) {
      for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
    }
    for (const auto& row : rows) {
      std::string line;
      for (size_t c = 0; c < row.size(); ++c) {
        line += c + 1 < row.size() ? fmt::format("{:<{}}  ", row[c], widths[c]) : row[c];
      }
      std::puts(line.c_str());
    }
    std::printf("\nfeatures: %s\n", fmt::format("{}", fmt::join(devices.front().features, ", ")).c_str());
    std::printf("lock directory: %s\n", lock_dir.c_str());
    return 0;
  };
}

}  // namespace kiln::cli
