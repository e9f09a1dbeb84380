// tandem device API — types shared by every primitive family.
#pragma once

#include <cstdint>

#include "tandem/transport/device_comm.h"

namespace tandem::device {

using tandem::DeviceComm;
using tandem::DeviceOp;
using tandem::Status;

// How a signal changes the remote 64-bit flag.
enum class SignalOp : int32_t {
  kSet = 0,  // flag = value   (single writer per flag)
  kAdd = 1,  // flag += value  (any number of writers)
};

// Comparison of wait_until: the wait ends when `*flag <cmp> value` holds.
enum class Cmp : int32_t { kEq = 0, kNe = 1, kGe = 2, kGt = 3, kLe = 4, kLt = 5 };

// Which threads execute a primitive together. Every thread of the group must call it with the same arguments.
enum class Group : int32_t { kThread = 0, kWarp = 1, kBlock = 2 };

}  // namespace tandem::device
