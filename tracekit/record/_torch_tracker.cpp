// tracekit's PyTorch tracker: every caching-allocator event, as it happens, into a shared ring.
//
// PyTorch keeps its memory history (torch.cuda.memory._record_memory_history) in the process's own
// memory, so a program that ends by os._exit, exec or SIGKILL takes it along. The caching allocator
// also calls "trace trackers" (c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker, C++
// only) with each TraceEntry it records, under its own lock and before the entry goes to the
// history. This tracker writes one fixed row per entry into a ring of slots in a file mapped
// MAP_SHARED (made and laid out by tracekit/record/torch_ring.py, the layout of
// tracekit/record/_fastpath.c's Ring: 8 header words, then slots of ROW_INTS words and a marker),
// so the kernel keeps every row whatever becomes of the process, and tracekit's watcher turns the
// ring into the trace when the process is gone. Per event: one clock read (vDSO), one atomic add,
// eight stores and two release barriers. No Python, no lock, no allocation (PyTorch: "the callback
// must not call into PyTorch or take the GIL").
//
// Row: [0] action (tracekit's code, below), [1] device, [2] addr (for an OOM: the free bytes CUDA
// reported), [3] size (requested bytes for an alloc, as PyTorch's history has it), [4] stream,
// [5] wall-clock time in microseconds (CLOCK_REALTIME, as the history's time_us).
//
// Built by tracekit/record/torch_ring.py against the PyTorch that runs the program (its headers and
// libc10_cuda), once per PyTorch build; loaded with ctypes. Public C++ API of c10 only.

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <exception>

namespace CA = c10::cuda::CUDACachingAllocator;

namespace {

constexpr int64_t ROW_INTS = 6;
constexpr int64_t HEADER_INTS = 8;

// tracekit's action codes (torch_ring.py ACTIONS), independent of the order of PyTorch's enum.
enum Code : int64_t {
  OTHER = 0,
  ALLOC = 1,
  FREE_REQUESTED = 2,
  FREE_COMPLETED = 3,
  SEGMENT_ALLOC = 4,
  SEGMENT_FREE = 5,
  SEGMENT_MAP = 6,
  SEGMENT_UNMAP = 7,
  SNAPSHOT = 8,
  OOM = 9,
};

int64_t* slots = nullptr;
int64_t nslots = 0;
std::atomic<int64_t> next_seq{0};
std::atomic<int> on{0};
bool attached = false;

int64_t code_of(CA::TraceEntry::Action a) {
  switch (a) {
    case CA::TraceEntry::ALLOC: return ALLOC;
    case CA::TraceEntry::FREE_REQUESTED: return FREE_REQUESTED;
    case CA::TraceEntry::FREE_COMPLETED: return FREE_COMPLETED;
    case CA::TraceEntry::SEGMENT_ALLOC: return SEGMENT_ALLOC;
    case CA::TraceEntry::SEGMENT_FREE: return SEGMENT_FREE;
    case CA::TraceEntry::SEGMENT_MAP: return SEGMENT_MAP;
    case CA::TraceEntry::SEGMENT_UNMAP: return SEGMENT_UNMAP;
    case CA::TraceEntry::SNAPSHOT: return SNAPSHOT;
    case CA::TraceEntry::OOM: return OOM;
    default: return OTHER;
  }
}

void track(const CA::TraceEntry& te) {
  if (!on.load(std::memory_order_acquire)) {
    return;
  }
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  // Several devices' allocators (each under its own lock) may call at once: each takes its own seq.
  const int64_t seq = next_seq.fetch_add(1, std::memory_order_relaxed);
  int64_t* slot = slots + (seq % nslots) * (ROW_INTS + 1);
  int64_t* mark = slot + ROW_INTS;
  __atomic_store_n(mark, int64_t{0}, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);  // the cleared marker before any of the new row
  slot[0] = code_of(te.action_);
  slot[1] = static_cast<int64_t>(te.device_);
  slot[2] = static_cast<int64_t>(te.addr_);
  slot[3] = static_cast<int64_t>(te.size_);
  slot[4] = static_cast<int64_t>(reinterpret_cast<intptr_t>(te.stream_));
  slot[5] = static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  __atomic_store_n(mark, seq + 1, __ATOMIC_RELEASE);  // the whole row before the marker
}

}  // namespace

extern "C" {

// The ints of one row: torch_ring.py checks it against its own before it attaches.
int64_t tk_row_ints() { return ROW_INTS; }

// Start writing into the ring whose header starts at `words` (laid out by torch_ring.py, `count`
// slots). 0 on success, -1 where PyTorch refused the tracker. The tracker stays attached for the
// process's life (PyTorch has no detach); tk_stop turns it into a no-op.
int tk_start(void* words, int64_t count) {
  if (words == nullptr || count <= 0) {
    return -1;
  }
  slots = static_cast<int64_t*>(words) + HEADER_INTS;
  nslots = count;
  next_seq.store(0, std::memory_order_relaxed);
  try {
    if (!attached) {
      CA::attachAllocatorTraceTracker(track);
      attached = true;
    }
  } catch (const std::exception&) {
    return -1;
  }
  on.store(1, std::memory_order_release);
  return 0;
}

void tk_stop() { on.store(0, std::memory_order_release); }

// Rows written since tk_start.
int64_t tk_seq() { return next_seq.load(std::memory_order_relaxed); }

}  // extern "C"
