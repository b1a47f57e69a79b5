// TensorBoardWriter: a job's training scalars as a TensorBoard event file, so
// that `tensorboard --logdir DIR` plots them while the job runs. Meant for
// the writer of a job's outputs (controller/outputs/job_outputs.h), next to
// metrics.jsonl: Open() when the job starts (a resumed job opens a new
// file), WriteScalars() once per committed step with the (name, value)
// pairs that go to metrics.jsonl. tests/read_tfevents.py reads the files
// back without TensorFlow and checks them against metrics.jsonl.
//
// The file: DIR/events.out.tfevents.<seconds>.<hostname>.fusionrl
// (TensorBoard reads every file whose name holds "tfevents"; a name already
// taken gets ".<n>" before ".fusionrl", so no writer clobbers another's
// file). It is a TFRecord file, a sequence of records, each
//
//   uint64 length                        little-endian
//   uint32 masked CRC-32C of those 8 length bytes
//   byte   data[length]                  one serialized tensorflow.Event
//   uint32 masked CRC-32C of data
//
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (tensorflow/
// core/lib/io/record_writer.cc; the same mask as our state journal). The
// first record is Event{wall_time, file_version: "brain.Event:2"}; each
// WriteScalars() adds Event{wall_time, step, summary: Summary{value: one
// Value{tag, simple_value} per scalar}}.
//
// The protobuf wire format is written by hand (we link no protobuf runtime
// and ship no .proto for these); the field numbers are upstream's:
//
//   tensorflow/core/util/event.proto        Event: double wall_time = 1;
//       int64 step = 2; string file_version = 3; Summary summary = 5
//   tensorflow/core/framework/summary.proto Summary: repeated Value value = 1;
//       Value: string tag = 1; float simple_value = 2
//
// (tensorboard/compat/proto/{event,summary}.proto carry the same numbers).
// As proto3 serializers do, fields holding their default (step 0, wall time
// 0.0) are left out, so a record is byte for byte what TensorFlow's own
// writer makes of the same Event (the tests check a published reference).
//
// Values: simple_value is a float, so each double is rounded to float;
// magnitudes beyond float's range become +-inf. NaN and +-inf are written
// as they are (TensorBoard plots NaN as a gap and marks it), unlike
// metrics.jsonl, which writes null for them.
//
// Durability: WriteScalars() writes its whole record and flushes it to the
// kernel before it returns (no fsync: a killed job loses nothing, a crashed
// machine may lose the tail). A job killed mid-write leaves a torn last
// record: TensorBoard's loader stops reading there (and would go on if the
// record were completed), so every earlier step still shows. After a failed
// write the file may end in such a torn record, so the writer refuses all
// later writes (FailedPrecondition naming the first error) rather than
// append records that no reader would reach.
//
// Errors: InvalidArgument for a bad wall time or a directory or file that
// cannot be created (the path and the system's reason, e.g. "Not a
// directory"); Internal when writing or flushing fails (the path and e.g.
// "No space left on device"). Nothing throws.
//
// Thread safety: not thread-safe; one writer per file, called from one
// thread at a time.
#ifndef FUSIONRL_CONTROLLER_OUTPUTS_TENSORBOARD_H_
#define FUSIONRL_CONTROLLER_OUTPUTS_TENSORBOARD_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) if missing and a new event file in it
  // named after int(wall_time_seconds) and this host, holding the
  // file_version event (removed again if that cannot be written).
  // `wall_time_seconds`: seconds since the Unix epoch (finite, >= 0).
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(
      const std::string& dir, double wall_time_seconds);

  // Flushes and closes the file (errors are dropped: call Flush() first to
  // see them).
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one event at `step` holding `scalars` (tag, value) in order, and
  // flushes it. An empty `scalars` still writes an (empty) event. Tags are
  // written as given (TensorBoard groups charts by the part before '/').
  absl::Status WriteScalars(
      int64_t step, double wall_time_seconds,
      const std::vector<std::pair<std::string, double>>& scalars);

  // Flushes buffered bytes to the kernel.
  absl::Status Flush();

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::FILE* file)
      : path_(std::move(path)), file_(file) {}

  // Writes `record` (a framed Event) and flushes; on failure records the
  // error in failed_.
  absl::Status WriteRecord(const std::string& record);

  std::string path_;
  std::FILE* file_ = nullptr;
  absl::Status failed_;  // the first write error; OK while none
};

namespace internal {

// The masked CRC-32C of `data`, as TFRecord stores it.
uint32_t MaskedCrc32c(absl::string_view data);

// `payload` framed as one TFRecord record.
std::string FrameTfRecord(absl::string_view payload);

// A serialized tensorflow.Event with its file_version set.
std::string EncodeFileVersionEvent(double wall_time_seconds,
                                   absl::string_view file_version);

// A serialized tensorflow.Event with a summary of simple values.
std::string EncodeScalarsEvent(
    int64_t step, double wall_time_seconds,
    const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace internal
}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_OUTPUTS_TENSORBOARD_H_
