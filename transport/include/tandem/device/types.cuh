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

// Memory ordering of a signal / wait_until.
//  kRelease / kAcquire (the default): the flag publishes the signaller's earlier writes; a wait that observes
//    it makes them visible. Costs one memory barrier per signal (MEMBAR) and an L1 invalidation per acquire
//    load on Hopper.
//  kRelaxed: the flag is a notification only. It orders nothing else: data written before a relaxed signal
//    may arrive after it. Use it where the flag itself is the message (a doorbell, a credit count, a step
//    counter) or where ordering comes from elsewhere (a value that carries its own flag, as in NCCL's LL
//    protocol; a later release). It halves the flag round trip on one H200 (docs/memory-model.md).
enum class Order : int32_t { kOrdered = 0, kRelaxed = 1 };

// Comparison of wait_until: the wait ends when `*flag <cmp> value` holds.
enum class Cmp : int32_t { kEq = 0, kNe = 1, kGe = 2, kGt = 3, kLe = 4, kLt = 5 };

// Which threads execute a primitive together. Every thread of the group must call it with the same arguments.
enum class Group : int32_t { kThread = 0, kWarp = 1, kBlock = 2 };

}  // namespace tandem::device
