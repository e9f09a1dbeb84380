#include "heap.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>

#include "driver_api.h"
#include "fd_passing.h"
#include "unix_socket.h"
#include "tandem/transport/status.h"

namespace tandem {

namespace {

using detail::driver_api;

uint64_t round_up(uint64_t n, uint64_t g) { return (n + g - 1) / g * g; }

// Barrier among `ranks` only (ranks of other nodes never touch these keys); returns what each published.
std::map<int, std::string> node_gather(Bootstrap& b, const std::string& tag, int rank, const std::vector<int>& ranks,
                                       const std::string& mine) {
  b.set(tag + "/" + std::to_string(rank), mine);
  std::map<int, std::string> out{{rank, mine}};
  for (int r : ranks)
    if (r != rank) out[r] = b.get(tag + "/" + std::to_string(r));
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// cuMem VMM: one VA reservation holding every local rank's heap back to back; the physical allocation of each
// rank is exported as a POSIX fd, passed over a unix socket and imported, so every importer holds its own
// reference (the memory outlives a crashed exporter, and survivors' stores never fault).
class VmmHeap final : public SymmetricHeap {
 public:
  explicit VmmHeap(const HeapSetup& s) : rank_(s.rank), world_(s.world) {
    // A throwing constructor runs no destructor: give back what was reserved, created and mapped so far.
    try {
      setup(s);
    } catch (...) {
      release();
      throw;
    }
  }

  ~VmmHeap() override { release(); }

 private:
  void setup(const HeapSetup& s) {
    const auto& api = driver_api();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = s.device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    TANDEM_CU_CHECK(api.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                    "heap.vmm", rank_);
    bytes_ = round_up(s.bytes, gran);
    slots_ = s.local_ranks;
    slot_of_.assign(world_, -1);
    for (size_t i = 0; i < slots_.size(); ++i) slot_of_[slots_[i]] = static_cast<int>(i);

    TANDEM_CU_CHECK(api.cuMemAddressReserve(&va_, bytes_ * slots_.size(), gran, 0, 0), "heap.vmm", rank_);
    CUmemGenericAllocationHandle mine{};
    TANDEM_CU_CHECK(api.cuMemCreate(&mine, bytes_, &prop, 0), "heap.vmm.create", rank_);
    handles_.push_back(mine);
    map_slot(slot_of_[rank_], mine);
    set_access(slot_of_[rank_], s.device);
    TANDEM_CUDA_CHECK(cudaMemset(local_base(), 0, bytes_), "heap.vmm", rank_);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize(), "heap.vmm", rank_);

    if (slots_.size() > 1) {
      int fd = -1;
      TANDEM_CU_CHECK(api.cuMemExportToShareableHandle(&fd, mine, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                      "heap.vmm.export", rank_);
      std::map<int, int> fds;
      try {
        // Only this node's ranks take part; each publishes its pid so that peers can match SO_PEERCRED.
        const std::string session = detail::node_session(*s.bootstrap, s.tag, rank_, slots_);
        detail::FdExchange exchange(session, rank_, s.timeout);
        const auto identities = node_gather(*s.bootstrap, s.tag + "/listening", rank_, slots_, detail::local_identity());
        fds = exchange.run(slots_, fd, s.secret, identities);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
      // Every received descriptor is closed exactly once, also when an import or map below throws.
      struct CloseRest {
        std::map<int, int>& fds;
        ~CloseRest() {
          for (auto& [peer, peer_fd] : fds)
            if (peer_fd >= 0) ::close(peer_fd);
        }
      } close_rest{fds};
      for (auto& [peer, peer_fd] : fds) {
        CUmemGenericAllocationHandle h{};
        const CUresult r = api.cuMemImportFromShareableHandle(
            &h, reinterpret_cast<void*>(static_cast<uintptr_t>(peer_fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        ::close(peer_fd);
        peer_fd = -1;
        if (r != CUDA_SUCCESS) throw_cu_error(r, "cuMemImportFromShareableHandle", "heap.vmm.import", rank_, peer);
        handles_.push_back(h);
        map_slot(slot_of_[peer], h);
        set_access(slot_of_[peer], s.device);
      }
    }
  }

  // Unmap, release, free the reservation: safe on a partly built heap (the constructor's failure path).
  void release() noexcept {
    const auto& api = driver_api();
    for (int slot : mapped_) api.cuMemUnmap(slot_addr(slot), bytes_);
    for (auto h : handles_) api.cuMemRelease(h);
    if (va_ != 0) api.cuMemAddressFree(va_, bytes_ * slots_.size());
    mapped_.clear();
    handles_.clear();
    va_ = 0;
  }

 public:
  char* local_base() const override { return peer_base(rank_); }
  uint64_t bytes() const override { return bytes_; }
  char* peer_base(int rank) const override {
    if (rank < 0 || rank >= world_ || slot_of_[rank] < 0) return nullptr;
    return reinterpret_cast<char*>(slot_addr(slot_of_[rank]));
  }
  const char* kind() const override { return "vmm"; }

 private:
  CUdeviceptr slot_addr(int slot) const { return va_ + static_cast<CUdeviceptr>(slot) * bytes_; }
  void map_slot(int slot, CUmemGenericAllocationHandle h) {
    TANDEM_CU_CHECK(driver_api().cuMemMap(slot_addr(slot), bytes_, 0, h, 0), "heap.vmm.map", rank_);
    mapped_.push_back(slot);
  }
  void set_access(int slot, int device) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    TANDEM_CU_CHECK(driver_api().cuMemSetAccess(slot_addr(slot), bytes_, &desc, 1), "heap.vmm.access", rank_);
  }

  int rank_, world_;
  uint64_t bytes_ = 0;
  CUdeviceptr va_ = 0;
  std::vector<int> slots_, slot_of_, mapped_;
  std::vector<CUmemGenericAllocationHandle> handles_;
};

// ---------------------------------------------------------------------------------------------------------
// cudaMalloc + legacy IPC handles (64 bytes, exchanged through the bootstrap). Fallback for drivers or
// containers without fd-exportable VMM memory.
class IpcHeap final : public SymmetricHeap {
 public:
  explicit IpcHeap(const HeapSetup& s) : rank_(s.rank), bytes_(round_up(s.bytes, 2u << 20)) {
    try {  // a throwing constructor runs no destructor: free our allocation, close what was opened
      setup(s);
    } catch (...) {
      release();
      throw;
    }
  }
  ~IpcHeap() override { release(); }

 private:
  void setup(const HeapSetup& s) {
    bases_.assign(s.world, nullptr);
    void* mine = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&mine, bytes_), "heap.ipc.alloc", rank_);
    bases_[rank_] = static_cast<char*>(mine);
    TANDEM_CUDA_CHECK(cudaMemset(mine, 0, bytes_), "heap.ipc", rank_);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize(), "heap.ipc", rank_);
    cudaIpcMemHandle_t handle{};
    if (s.local_ranks.size() > 1) TANDEM_CUDA_CHECK(cudaIpcGetMemHandle(&handle, mine), "heap.ipc.export", rank_);
    const auto all = s.bootstrap->all_gather(
        s.tag + "/ipc", std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
    for (int peer : s.local_ranks) {
      if (peer == rank_) continue;
      cudaIpcMemHandle_t h{};
      std::memcpy(&h, all[peer].data(), std::min(all[peer].size(), sizeof(h)));
      void* p = nullptr;
      const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) throw_cuda_error(e, "cudaIpcOpenMemHandle", "heap.ipc.import", rank_, peer);
      bases_[peer] = static_cast<char*>(p);
    }
  }
  void release() noexcept {
    for (size_t r = 0; r < bases_.size(); ++r) {
      if (bases_[r] == nullptr) continue;
      if (static_cast<int>(r) == rank_) cudaFree(bases_[r]);
      else cudaIpcCloseMemHandle(bases_[r]);
      bases_[r] = nullptr;
    }
  }

 public:
  char* local_base() const override { return bases_[rank_]; }
  uint64_t bytes() const override { return bytes_; }
  char* peer_base(int rank) const override {
    return rank >= 0 && rank < static_cast<int>(bases_.size()) ? bases_[rank] : nullptr;
  }
  const char* kind() const override { return "ipc"; }

 private:
  int rank_;
  uint64_t bytes_;
  std::vector<char*> bases_;
};

}  // namespace

bool vmm_heap_supported(int device) {
  const auto& api = driver_api();
  if (!api.complete) return false;
  int vmm = 0, fd = 0;
  if (api.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) != CUDA_SUCCESS)
    return false;
  if (api.cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device) !=
      CUDA_SUCCESS)
    return false;
  return vmm != 0 && fd != 0;
}

std::unique_ptr<SymmetricHeap> make_vmm_heap(const HeapSetup& setup) { return std::make_unique<VmmHeap>(setup); }
std::unique_ptr<SymmetricHeap> make_ipc_heap(const HeapSetup& setup) { return std::make_unique<IpcHeap>(setup); }

}  // namespace tandem
