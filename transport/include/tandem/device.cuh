// tandem device API — umbrella header. Include this from a .cu file and pass a tandem::DeviceComm (obtained
// from the host Communicator) to your kernel by value.
#pragma once

#include "tandem/device/types.cuh"
#include "tandem/device/put.cuh"
#include "tandem/device/signal.cuh"
#include "tandem/device/wait.cuh"
#include "tandem/device/barrier.cuh"
#include "tandem/device/quiet.cuh"
#include "tandem/device/local.cuh"
#include "tandem/device/scoped.cuh"
