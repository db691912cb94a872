// SlotPool: recycles the batch buffers ("slots") that workers decode into.
//
// The pool does not allocate: its owner adds slots (memory plus an owner
// handle that keeps that memory alive), so the Python side decides where
// batch memory comes from (plain or page-locked). acquire() hands out a slot
// as a shared_ptr; when the last copy is dropped (for example when the user
// drops the last tensor viewing the batch) a reusable slot returns to the
// pool, or is freed if the pool is gone. A steady loop therefore allocates
// nothing.
//
// A single-use slot (reusable = false) is handed out once and then freed
// (its owner released): page-locked batches use them, because a non_blocking
// host-to-device copy may still read a batch after its last tensor is gone;
// only the owner's allocator (torch's caching host allocator, which tracks
// those copies) may decide when that memory is written again.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace fastload {

struct Slot {
  uint8_t* data = nullptr;
  size_t size = 0;
  // When not empty, field f of the batch lives at field_data[f] (null for a
  // field not decoded) rather than at data + the reader's offset for f.
  std::vector<uint8_t*> field_data;
  std::shared_ptr<void> owner;  // keeps `data` (or every field_data buffer) alive
  bool reusable = true;         // false: freed, not pooled, after its one use
};

class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  explicit SlotPool(size_t slot_bytes) : slot_bytes_(slot_bytes) {}

  size_t slot_bytes() const noexcept { return slot_bytes_; }

  // Adds a slot of at least slot_bytes() bytes at `data`, kept alive by `owner`;
  // with reusable = false it is freed after one use instead of returning.
  // Throws FastloadError when it is too small.
  void add(uint8_t* data, size_t size, std::shared_ptr<void> owner, bool reusable = true);

  // Adds a slot whose fields live in separate buffers (see Slot::field_data);
  // the caller has checked their sizes.
  void add_split(std::vector<uint8_t*> field_data, std::shared_ptr<void> owner, bool reusable);

  // A free slot, or nullptr when every slot is in use. The pool must be
  // owned by a shared_ptr.
  std::shared_ptr<Slot> try_acquire();

  // From now on keeps at most `count` free slots: extra free slots are freed
  // now, and a slot coming back to a pool that holds `count` free ones is
  // freed instead of kept. A pool that outlives its reader (handed to the next
  // one) so never holds more than its owner expects to need, whatever number
  // of batches a consumer once held at the same time.
  void keep_at_most(size_t count);

  size_t free_count() const;
  // Slots the pool holds: free ones plus those handed out and not yet back.
  size_t total_count() const;

 private:
  void give_back(std::unique_ptr<Slot> slot);
  void retire(std::unique_ptr<Slot> slot);

  const size_t slot_bytes_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Slot>> free_;
  size_t total_ = 0;
  size_t max_free_ = SIZE_MAX;
};

}  // namespace fastload
