// Helper process for device_manager_test's cross-process tests: attaches a
// sim device through DeviceManager in the given lock directory, says so on
// stdout, holds the device for a while, then exits (releasing it).
//
//   kiln_device_lock_holder LOCK_DIR SIM_DEVICES DEVICE_ID HOLD_MS
// Prints "attached <id>\n" once attached; exit code 0, or 1 on failure.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "kiln/device.h"
#include "kiln/error.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s LOCK_DIR SIM_DEVICES DEVICE_ID HOLD_MS\n", argv[0]);
    return 1;
  }
  try {
    kiln::DeviceManagerOptions options;
    options.lock_dir = argv[1];
    options.sim_devices = static_cast<uint32_t>(std::stoul(argv[2]));
    kiln::DeviceManager manager(options);
    std::shared_ptr<kiln::Device> device = manager.getSpecificDevice(argv[3]);
    std::printf("attached %s\n", device->id().c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoul(argv[4])));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_device_lock_holder: %s\n", e.what());
    return 1;
  }
  return 0;
}
