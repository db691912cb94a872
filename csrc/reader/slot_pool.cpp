#include "reader/slot_pool.h"

#include <string>

#include "errors.h"

namespace fastload {

void SlotPool::add(uint8_t* data, size_t size, std::shared_ptr<void> owner, bool reusable) {
  if (size < slot_bytes_) {
    throw FastloadError("slot of " + std::to_string(size) + " bytes is smaller than the " +
                        std::to_string(slot_bytes_) + " a batch needs");
  }
  auto slot = std::make_unique<Slot>();
  slot->data = data;
  slot->size = size;
  slot->owner = std::move(owner);
  slot->reusable = reusable;
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(slot));
  ++total_;
}

void SlotPool::add_split(std::vector<uint8_t*> field_data, std::shared_ptr<void> owner, bool reusable) {
  auto slot = std::make_unique<Slot>();
  slot->field_data = std::move(field_data);
  slot->owner = std::move(owner);
  slot->reusable = reusable;
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(slot));
  ++total_;
}

std::shared_ptr<Slot> SlotPool::try_acquire() {
  std::unique_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) return nullptr;
    slot = std::move(free_.back());
    free_.pop_back();
  }
  std::weak_ptr<SlotPool> pool = weak_from_this();
  // The shared_ptr takes the slot over from the unique_ptr; its deleter hands
  // it back to a living pool, or frees it.
  return std::shared_ptr<Slot>(slot.release(), [pool](Slot* raw) {
    std::unique_ptr<Slot> owned(raw);
    auto alive = pool.lock();
    if (!alive) return;
    if (owned->reusable) {
      alive->give_back(std::move(owned));
    } else {
      alive->retire(std::move(owned));
    }
  });
}

void SlotPool::retire(std::unique_ptr<Slot> slot) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --total_;
  }
  slot.reset();  // releases the owner outside the lock
}

void SlotPool::give_back(std::unique_ptr<Slot> slot) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < max_free_) {
      free_.push_back(std::move(slot));
      return;
    }
    --total_;
  }
  slot.reset();  // freed outside the lock: its owner may take the GIL
}

void SlotPool::keep_at_most(size_t count) {
  std::vector<std::unique_ptr<Slot>> extra;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    max_free_ = count;
    while (free_.size() > count) {
      extra.push_back(std::move(free_.back()));
      free_.pop_back();
      --total_;
    }
  }
  extra.clear();  // outside the lock, as in give_back
}

size_t SlotPool::free_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_.size();
}

size_t SlotPool::total_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_;
}

}  // namespace fastload
