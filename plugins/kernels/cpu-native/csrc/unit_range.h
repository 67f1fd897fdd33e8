// A thread's share of a parallel call's units, taken one at a time: by the thread that owns them from the front,
// in order, and by the other threads from the back once they have none of their own left. A call's threads then
// end together even where one started late (woken from sleep) or ran slower (memory, a neighbour on the core):
// with static shares, the offline workload's matmuls left one of two threads idle 1.8 s of 57 and its attention
// 0.6 s of 4.5 (AMD Zen 4, 2026-12-05). A unit is computed with the same instructions whichever thread takes it,
// so no result depends on who did. A share holds fewer than 2^32 units (a call's matmul panels times its chunks of
// rows, or its attention items).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace llmp_native {

class alignas(64) UnitRange {
  public:
    void reset(int64_t count) {
        count_ = count;
        span_.store(uint64_t(count) << 32, std::memory_order_relaxed);
    }
    // the units it was given
    int64_t size() const { return count_; }
    // the owner's next unit, or -1 when none is left
    int64_t take_front() { return take(true); }
    // the last unit left, for another thread, or -1
    int64_t take_back() { return take(false); }

  private:
    int64_t take(bool front_end) {
        uint64_t span = span_.load(std::memory_order_relaxed);
        while (true) {
            const uint64_t front = span & 0xffffffffu, back = span >> 32;
            if (front >= back) return -1;
            const uint64_t next = front_end ? (back << 32) | (front + 1) : ((back - 1) << 32) | front;
            if (span_.compare_exchange_weak(span, next, std::memory_order_relaxed))
                return static_cast<int64_t>(front_end ? front : back - 1);
        }
    }
    std::atomic<uint64_t> span_{0};  // the first unit left (low 32 bits), one past the last (high 32 bits)
    int64_t count_ = 0;
};

// Runs owned(owner, unit) for each unit of each owner of [begin, end), then stolen(owner, unit) for the units
// other owners have left, the last first: the body of a parallel_for over owners.
template <class Owned, class Stolen>
void take_units(std::vector<UnitRange>& ranges, int64_t begin, int64_t end, Owned owned, Stolen stolen) {
    const int64_t owners = static_cast<int64_t>(ranges.size());
    for (int64_t o = begin; o < end; ++o)
        for (int64_t unit = ranges[o].take_front(); unit >= 0; unit = ranges[o].take_front()) owned(o, unit);
    for (int64_t k = 0; k < owners; ++k) {
        const int64_t o = (end + k) % owners;
        for (int64_t unit = ranges[o].take_back(); unit >= 0; unit = ranges[o].take_back()) stolen(o, unit);
    }
}

}  // namespace llmp_native
