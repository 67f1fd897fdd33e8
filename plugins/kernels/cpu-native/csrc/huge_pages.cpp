// The chunks of huge_pages.h: mapped, advised and handed out in 64-byte-aligned pieces; each piece's tensor holds
// its chunk, the allocator only a weak reference to the chunk it is filling.
#include "huge_pages.h"

#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace llmp_native {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kChunk = size_t(64) << 20;
constexpr size_t kAlign = 64;  // as torch's CPU allocator: every vector load of a row stays in its lines

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

class Chunk {
  public:
    // `bytes` (a multiple of 2 MiB) mapped at a 2 MiB boundary and advised for huge pages; nullptr where mmap fails
    static std::shared_ptr<Chunk> map(size_t bytes) {
#if defined(__linux__)
        const size_t mapped = bytes + kHugePage;  // room to start at a 2 MiB boundary
        void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) return nullptr;
        char* base = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(raw), kHugePage));
#ifdef MADV_HUGEPAGE
        madvise(base, bytes, MADV_HUGEPAGE);  // refused (THP not built in): ordinary pages, as anywhere else
#endif
        return std::shared_ptr<Chunk>(new Chunk(raw, mapped, base, bytes));
#else
        (void)bytes;
        return nullptr;
#endif
    }
    ~Chunk() {
#if defined(__linux__)
        munmap(raw_, mapped_);
#endif
    }
    char* base() const { return base_; }
    size_t size() const { return size_; }

  private:
    Chunk(void* raw, size_t mapped, char* base, size_t size) : raw_(raw), mapped_(mapped), base_(base), size_(size) {}
    void* raw_;
    size_t mapped_;
    char* base_;
    size_t size_;
};

std::mutex arena_mutex;
std::weak_ptr<Chunk> filling;  // the chunk pieces come from, while a tensor of it lives
size_t filled = 0;             // its bytes handed out

}  // namespace

at::Tensor empty_on_huge_pages(at::IntArrayRef sizes, at::ScalarType dtype) {
    const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
    int64_t count = 1;
    for (int64_t size : sizes) count *= size;
    const size_t bytes = size_t(count) * at::elementSize(dtype);
    if (bytes == 0) return at::empty(sizes, options);
    std::shared_ptr<Chunk> chunk;
    size_t offset = 0;
    {
        std::lock_guard<std::mutex> lock(arena_mutex);
        chunk = filling.lock();
        if (!chunk || filled + bytes > chunk->size()) {
            chunk = Chunk::map(std::max(kChunk, round_up(bytes, kHugePage)));
            if (!chunk) return at::empty(sizes, options);
            filling = chunk;
            filled = 0;
        }
        offset = filled;
        filled = round_up(filled + bytes, kAlign);
    }
    return at::from_blob(chunk->base() + offset, sizes, [chunk](void*) {}, options);
}

at::Tensor copy_to_huge_pages(const at::Tensor& tensor) {
    TORCH_CHECK(tensor.device().is_cpu(), "copy_to_huge_pages: a CPU tensor");
    at::Tensor copy = empty_on_huge_pages(tensor.sizes(), tensor.scalar_type());
    copy.copy_(tensor);
    return copy;
}

}  // namespace llmp_native

TORCH_LIBRARY_FRAGMENT(llmp_native, m) {
    // a contiguous copy of a CPU tensor on 2 MiB pages where Linux gives them (huge_pages.h): for weights read whole
    // at every decode step, such as a GGUF file's blocks
    m.def("copy_to_huge_pages(Tensor tensor) -> Tensor", &llmp_native::copy_to_huge_pages);
}
