// StateJournal: what the controller must not forget, on disk, in one
// directory (`fusionrl controller --state-dir DIR`):
//
//   DIR/snapshot  one framed record: the whole state at some point
//   DIR/journal   framed records appended after it, in order
//
// A framed record is [u32 length][u32 masked CRC-32C of the payload]
// [payload], little-endian (the LevelDB log's mask, so a CRC of data that
// itself holds CRCs stays meaningful). The payloads are opaque here (the
// controller's state protos, proto/fusionrl/v1/state.proto).
//
// Durability: Append() writes its records and fdatasync()s before it
// returns, so a caller that acknowledges a change only after Append() never
// acknowledges what a crash can take back. Compact() writes the snapshot to
// a temporary file, fsyncs it, renames it over `snapshot`, fsyncs the
// directory, and only then empties `journal`: a crash at any point leaves
// either the old snapshot with the whole journal or the new snapshot with
// a journal whose records it already holds (the payloads carry sequence
// numbers so that the reader skips those).
//
// Damage: a journal whose tail is cut short (a crash mid-write) or whose
// record fails its CRC is read up to the last good record; Open() says so
// in `Loaded::warning` and truncates the file there, so new records follow
// good ones. A damaged snapshot is an error: it was written atomically, so
// damage there is not a crash but lost data, and starting from an older
// state would silently undo acknowledged work.
//
// Thread safety: not thread-safe; the controller calls it from one writer
// at a time.
#ifndef FUSIONRL_CONTROLLER_STATE_JOURNAL_H_
#define FUSIONRL_CONTROLLER_STATE_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

class StateJournal {
 public:
  // What Open() found.
  struct Loaded {
    bool has_snapshot = false;
    std::string snapshot;              // the snapshot's payload
    std::vector<std::string> records;  // the journal's good records
    // Not empty when the journal's tail was damaged: what, where, and how
    // many records were kept.
    std::string warning;
  };

  // Opens (creating) `dir` and reads what it holds into `loaded`.
  // DataLoss if the snapshot is damaged; Unavailable if the directory or
  // its files cannot be created, read or truncated (naming the path).
  static absl::StatusOr<std::unique_ptr<StateJournal>> Open(
      const std::string& dir, Loaded* loaded);

  ~StateJournal();
  StateJournal(const StateJournal&) = delete;
  StateJournal& operator=(const StateJournal&) = delete;

  // Appends `records` and syncs them to disk. On error the journal may hold
  // a damaged tail (the next Open() drops it); the caller must not
  // acknowledge the change.
  absl::Status Append(const std::vector<std::string>& records);

  // Replaces the snapshot by `snapshot` and empties the journal.
  absl::Status Compact(absl::string_view snapshot);

  // Bytes in the journal since the last Compact() (or Open()).
  int64_t journal_bytes() const { return journal_bytes_; }
  const std::string& dir() const { return dir_; }

 private:
  StateJournal(std::string dir, int fd, int64_t bytes)
      : dir_(std::move(dir)), fd_(fd), journal_bytes_(bytes) {}

  std::string dir_;
  int fd_ = -1;  // DIR/journal, opened for appending
  int64_t journal_bytes_ = 0;
};

namespace internal {

// `payload` framed as a journal record.
std::string FrameRecord(absl::string_view payload);

// The records of `data` up to the first damaged one. `good_bytes`: the
// length of the good prefix; `error`: why the rest was not read (empty when
// all of `data` was good).
std::vector<std::string> ReadFramedRecords(absl::string_view data,
                                           int64_t* good_bytes,
                                           std::string* error);

}  // namespace internal
}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_STATE_JOURNAL_H_
