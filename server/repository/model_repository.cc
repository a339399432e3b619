#include "server/repository/model_repository.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "attn/status_macros.h"
#include "google/protobuf/text_format.h"
#include "server/repository/safetensors.h"

namespace attnserve {
namespace {

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

// A model folder's numbered files: rows-<n>.safetensors, each an append's
// rows, evicted-<n>, each an eviction's record (the highest counts), and
// base-<k>.safetensors, each a compaction's (the highest counts).
constexpr absl::string_view kRowsPrefix = "rows-";
constexpr absl::string_view kRowsSuffix = ".safetensors";
constexpr absl::string_view kEvictedPrefix = "evicted-";
constexpr absl::string_view kBasePrefix = "base-";
constexpr absl::string_view kWeightsFile = "weights.safetensors";
// A base is fsynced every this many bytes as it is written (WriteDurably).
constexpr int64_t kCompactionSyncBytes = int64_t{64} << 20;
// A base's metadata: the highest rows file and eviction record it covers,
// and the base its rows were written from with the rows evicted from that
// one before them (an eviction record written while it was being written
// counts from there).
constexpr absl::string_view kBaseRowsFiles = "rows_files";
constexpr absl::string_view kBaseEvictions = "evictions";
constexpr absl::string_view kBasePrevious = "previous_base";
constexpr absl::string_view kBasePreviousEvicted = "previous_evicted_rows";

// The number <n> of a file named <prefix><n><suffix>; nullopt for any
// other name.
std::optional<uint64_t> FileNumber(const std::string& file,
                                   absl::string_view prefix,
                                   absl::string_view suffix) {
  absl::string_view digits = file;
  if (!absl::ConsumePrefix(&digits, prefix) ||
      !absl::ConsumeSuffix(&digits, suffix) || digits.empty() ||
      digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != absl::string_view::npos) {
    return std::nullopt;
  }
  uint64_t number = 0;
  if (!absl::SimpleAtoi(digits, &number)) return std::nullopt;
  return number;
}

std::string NumberedFileName(absl::string_view prefix, uint64_t number,
                             absl::string_view suffix) {
  return absl::StrFormat("%s%08d%s", prefix, number, suffix);
}

// A model folder's rows files, eviction records and bases, each by number.
struct NumberedFiles {
  std::map<uint64_t, std::string> rows;
  std::map<uint64_t, std::string> evictions;
  std::map<uint64_t, std::string> bases;
};
absl::StatusOr<NumberedFiles> ListNumberedFiles(FileSystem& fs,
                                                const std::string& folder) {
  ASSIGN_OR_RETURN(std::vector<FileSystem::Entry> entries, fs.ListDir(folder));
  NumberedFiles files;
  for (const FileSystem::Entry& entry : entries) {
    if (entry.is_dir) continue;
    if (std::optional<uint64_t> number =
            FileNumber(entry.name, kRowsPrefix, kRowsSuffix)) {
      files.rows[*number] = entry.name;
    } else if (std::optional<uint64_t> number =
                   FileNumber(entry.name, kEvictedPrefix, "")) {
      files.evictions[*number] = entry.name;
    } else if (std::optional<uint64_t> number =
                   FileNumber(entry.name, kBasePrefix, kRowsSuffix)) {
      files.bases[*number] = entry.name;
    }
  }
  return files;
}

// What a base numbered `base_file` covers in `files`, taken out of it: the
// rows files up to `last_rows_file`, the eviction records up to
// `last_eviction` and the bases before it. A compaction removes them once
// the base is durable; a load skips any a kill left, then removes them.
// (weights.safetensors, which every base covers too, is not numbered: the
// callers add it.)
std::vector<std::string> TakeCoveredFiles(NumberedFiles& files,
                                          uint64_t base_file,
                                          uint64_t last_rows_file,
                                          uint64_t last_eviction) {
  std::vector<std::string> covered;
  auto take = [&](std::map<uint64_t, std::string>& numbered, uint64_t last) {
    while (!numbered.empty() && numbered.begin()->first <= last) {
      covered.push_back(numbered.begin()->second);
      numbered.erase(numbered.begin());
    }
  };
  take(files.rows, last_rows_file);
  take(files.evictions, last_eviction);
  if (base_file > 0) take(files.bases, base_file - 1);
  return covered;
}

// Checks that `rows` extend `tensors`: each names one of them, with its
// type and its dimensions after the first, and all have one first
// dimension n >= 1, which it returns. INVALID_ARGUMENT starting with
// `where`.
absl::StatusOr<int64_t> CheckRowsExtend(
    const std::string& where, const std::map<std::string, StoredTensor>& tensors,
    const ModelRepository::Rows& rows) {
  if (rows.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no rows"));
  }
  int64_t n = -1;
  for (const auto& [tensor_name, added] : rows) {
    auto it = tensors.find(tensor_name);
    const bool fits =
        it != tensors.end() && !added.shape.empty() &&
        added.shape.size() == it->second.shape.size() &&
        std::equal(added.shape.begin() + 1, added.shape.end(),
                   it->second.shape.begin() + 1) &&
        added.is_bfloat16() == it->second.is_bfloat16() &&
        added.shape[0] >= 1 && (n < 0 || added.shape[0] == n);
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": rows '", tensor_name, "' ",
          attn::ShapeToString(added.shape), added.is_bfloat16() ? " BF16" : " F32",
          " do not extend the model's ",
          it == tensors.end()
              ? std::string("tensors (no such tensor)")
              : absl::StrCat(attn::ShapeToString(it->second.shape),
                             it->second.is_bfloat16() ? " BF16" : " F32"),
          n < 0 ? "" : absl::StrCat(" by the same ", n, " rows")));
    }
    n = added.shape[0];
  }
  return n;
}

// An eviction record (the highest-numbered evicted-<n> of a folder): the
// rows evicted since the base it names (0, or no line: weights.safetensors),
// and the tensors they are dropped from.
struct Eviction {
  int64_t rows = 0;
  uint64_t base = 0;
  std::vector<std::string> tensors;
};
std::string SerializeEviction(const Eviction& eviction) {
  std::string text = absl::StrCat("rows ", eviction.rows, "\n");
  if (eviction.base > 0) absl::StrAppend(&text, "base ", eviction.base, "\n");
  for (const std::string& tensor : eviction.tensors) {
    absl::StrAppend(&text, "tensor ", tensor, "\n");
  }
  return text;
}
absl::StatusOr<Eviction> ParseEviction(absl::string_view text) {
  Eviction eviction;
  bool counted = false, based = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "rows ") && !counted &&
        absl::SimpleAtoi(line, &eviction.rows) && eviction.rows >= 0) {
      counted = true;
    } else if (absl::ConsumePrefix(&line, "base ") && !based &&
               absl::SimpleAtoi(line, &eviction.base)) {
      based = true;
    } else if (absl::ConsumePrefix(&line, "tensor ") && !line.empty()) {
      eviction.tensors.emplace_back(line);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("line '", line,
                       "' is not 'rows <n>', 'base <k>' or 'tensor <name>'"));
    }
  }
  if (!counted || eviction.tensors.empty()) {
    return absl::InvalidArgumentError(
        "needs a line 'rows <n>' and at least one 'tensor <name>'");
  }
  return eviction;
}

// Drops the oldest `rows` rows of `model`'s tensors named `tensors` (the
// views narrowed, nothing copied) and counts them in its evicted_rows:
// INVALID_ARGUMENT starting with `where` for a tensor it does not have or
// one it would leave empty, `model` then unchanged.
absl::Status DropOldestRows(const std::string& where,
                            const std::vector<std::string>& tensors,
                            int64_t rows, RepositoryModel* model) {
  for (const std::string& name : tensors) {
    auto it = model->tensors.find(name);
    if (it == model->tensors.end() || it->second.shape.empty() ||
        it->second.shape[0] <= rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": evicts ", rows, " rows of tensor '", name, "', which ",
          it == model->tensors.end()
              ? std::string("the model does not have")
              : absl::StrCat("holds ", attn::ShapeToString(it->second.shape))));
    }
  }
  for (const std::string& name : tensors) {
    StoredTensor& tensor = model->tensors[name];
    model->evicted_bytes += tensor.byte_size() / tensor.shape[0] * rows;
    tensor = DropRows(tensor, rows);
  }
  model->evicted_rows += rows;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> MaxRowsOf(const std::string& where,
                                  const RepositoryModel& model) {
  const auto& parameters = model.config.parameters();
  auto it = parameters.find("max_rows");
  if (it == parameters.end()) return 0;
  int64_t max_rows = 0;
  if (!absl::SimpleAtoi(it->second.string_value(), &max_rows) ||
      max_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": parameter 'max_rows': '", it->second.string_value(),
        "' is not a positive integer"));
  }
  return max_rows;
}

namespace {

// Reads and checks the model in folder `dir`/`name`, its weights mapped
// when `map_weights` and the file allows, then extended by its rows files
// in order, in `grown` (the tensors they extend; left empty when there are
// none). Where `in_pieces` says the model may be held in pieces, `grown`
// holds only the rows of the rows files, and `start` the base's tensors
// they follow (served where they are mapped); else `grown` holds every
// row and `start` is left empty. `covered` gets the files its base covers,
// which it skipped (left by a compaction a kill cut short). Messages name the files as
// `name`/<file>, relative to the repository; `log` gets why a file that
// could have been mapped was copied.
absl::StatusOr<std::shared_ptr<const RepositoryModel>> ReadModel(
    FileSystem& fs, const std::string& dir, const std::string& name,
    const ModelRepository::CheckModel& check, int64_t max_model_bytes,
    int64_t max_grown_model_bytes, bool map_weights,
    const std::function<void(const std::string&)>& log,
    const std::function<bool(const RepositoryModel&)>& in_pieces,
    std::map<std::string, GrowingTensor>* grown,
    std::map<std::string, StoredTensor>* start,
    std::vector<std::string>* covered) {
  auto model = std::make_shared<RepositoryModel>();
  auto failed = [&](const std::string& file, const absl::Status& status,
                    absl::string_view limit = "--max_model_bytes") {
    if (absl::IsResourceExhausted(status)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name, "/", file, ": ", status.message(), " (", limit, ")"));
    }
    return absl::Status(status.code(),
                        absl::StrCat(name, "/", file, ": cannot open (",
                                     status.message(), ")"));
  };
  const std::string folder = dir + "/" + name + "/";
  absl::StatusOr<std::string> config_text =
      fs.ReadFile(folder + "config.pbtxt", max_model_bytes);
  if (!config_text.ok()) return failed("config.pbtxt", config_text.status());
  if (!google::protobuf::TextFormat::ParseFromString(*config_text,
                                                     &model->config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "/config.pbtxt: not an inference.ModelConfig in protobuf "
              "text format"));
  }
  if (model->config.name() != name) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "/config.pbtxt: name '", model->config.name(),
        "' differs from its folder's name"));
  }
  // The rows start from the highest base, if a compaction left one, else
  // from weights.safetensors; a base may hold what appends grew past
  // --max_model_bytes.
  absl::StatusOr<NumberedFiles> numbered = ListNumberedFiles(fs, folder);
  if (!numbered.ok()) return failed("(the folder)", numbered.status());
  std::string weights_name(kWeightsFile);
  int64_t weights_limit = max_model_bytes;
  absl::string_view limit_name = "--max_model_bytes";
  if (!numbered->bases.empty()) {
    model->base_file = numbered->bases.rbegin()->first;
    weights_name = numbered->bases.rbegin()->second;
    weights_limit = max_grown_model_bytes;
    limit_name = "--max_grown_model_bytes";
  }
  const std::string weights_path = folder + weights_name;
  absl::StatusOr<std::shared_ptr<const FileBytes>> weights;
  if (map_weights) {
    weights = fs.MapFile(weights_path, weights_limit);
    if (weights.ok() && !(*weights)->why_copied().empty() &&
        !(*weights)->bytes().empty()) {
      log(absl::StrCat("'", name, "': ", weights_name,
                       " read into memory, ", (*weights)->why_copied()));
    }
  } else {
    absl::StatusOr<std::string> bytes = fs.ReadFile(weights_path, weights_limit);
    if (bytes.ok()) {
      weights = FileBytesInMemory(*std::move(bytes), "--map_model_weights is off");
    } else {
      weights = bytes.status();
    }
  }
  if (!weights.ok()) return failed(weights_name, weights.status(), limit_name);
  model->weights_mapped = (*weights)->why_copied().empty();
  model->stored_bytes = static_cast<int64_t>((*weights)->bytes().size());
  model->base_bytes = model->stored_bytes;
  // What a base covers: the rows files and eviction records up to these;
  // and the base before it, with the rows evicted from that one before its
  // first row (what a record counting from that base counts first).
  uint64_t covered_rows_files = 0;
  uint64_t covered_evictions = 0;
  uint64_t previous_base = 0;
  int64_t previous_evicted = 0;
  if (model->base_file > 0) {
    absl::StatusOr<SafetensorsMetadata> metadata =
        ParseSafetensorsMetadata((*weights)->bytes());
    auto count = [&](absl::string_view key, auto* value) {
      auto it = metadata->find(std::string(key));
      return it != metadata->end() && absl::SimpleAtoi(it->second, value) &&
             *value >= 0;
    };
    if (metadata.ok() && !(count(kBaseRowsFiles, &covered_rows_files) &&
                           count(kBaseEvictions, &covered_evictions) &&
                           count(kBasePrevious, &previous_base) &&
                           count(kBasePreviousEvicted, &previous_evicted))) {
      metadata = absl::InvalidArgumentError(absl::StrCat(
          "safetensors: __metadata__ needs '", kBaseRowsFiles, "', '",
          kBaseEvictions, "', '", kBasePrevious, "' and '",
          kBasePreviousEvicted, "', each a count"));
    }
    if (!metadata.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "/", weights_name, ": ", metadata.status().message()));
    }
  }
  absl::StatusOr<std::map<std::string, StoredTensor>> tensors =
      ParseSafetensorsShared(*std::move(weights));
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "/", weights_name, ": ", tensors.status().message()));
  }
  model->tensors = *std::move(tensors);
  // The files the base covers are left over from before it (a compaction
  // removes them once the base is durable): never read.
  *covered = TakeCoveredFiles(*numbered, model->base_file, covered_rows_files,
                              covered_evictions);
  if (model->base_file > 0 && fs.Stat(folder + std::string(kWeightsFile)).ok()) {
    covered->push_back(std::string(kWeightsFile));
  }
  const std::map<uint64_t, std::string>& rows_files = numbered->rows;
  const std::map<uint64_t, std::string>& evictions = numbered->evictions;
  model->last_rows_file = rows_files.empty() ? covered_rows_files
                                             : rows_files.rbegin()->first;
  model->last_eviction_file = evictions.empty() ? covered_evictions
                                                : evictions.rbegin()->first;
  grown->clear();
  start->clear();
  const bool pieces = in_pieces && in_pieces(*model);
  for (const auto& [number, file] : rows_files) {
    // The model's files together stay within the limit.
    const int64_t room = max_grown_model_bytes - model->stored_bytes;
    absl::StatusOr<std::shared_ptr<const FileBytes>> bytes;
    if (map_weights) {
      bytes = fs.MapFile(folder + file, room);
    } else if (absl::StatusOr<std::string> read = fs.ReadFile(folder + file, room);
               read.ok()) {
      bytes = FileBytesInMemory(*std::move(read), "--map_model_weights is off");
    } else {
      bytes = read.status();
    }
    if (!bytes.ok()) {
      return failed(file, bytes.status(),
                    "the model's files together, --max_grown_model_bytes");
    }
    model->stored_bytes += static_cast<int64_t>((*bytes)->bytes().size());
    absl::StatusOr<std::map<std::string, StoredTensor>> rows =
        ParseSafetensorsShared(*std::move(bytes));
    if (!rows.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "/", file, ": ", rows.status().message()));
    }
    RETURN_IF_ERROR(CheckRowsExtend(absl::StrCat(name, "/", file),
                                    model->tensors, *rows)
                        .status());
    // The rows grow on disk, in scratch files of the model's folder, when
    // models are mapped: mapped pages, not the server's own memory.
    const GrowingTensor::OnDisk on_disk{&fs, folder};
    for (const auto& [tensor_name, added] : *rows) {
      auto it = grown->find(tensor_name);
      absl::Status status;
      if (it == grown->end()) {
        // In pieces, the base's rows are not copied: the growing tensor
        // starts empty, after them.
        const StoredTensor& base = model->tensors.at(tensor_name);
        absl::StatusOr<GrowingTensor> made = GrowingTensor::Create(
            pieces ? DropRows(base, base.shape[0]) : base,
            max_grown_model_bytes, map_weights ? &on_disk : nullptr);
        if (made.ok()) {
          it = grown->emplace(tensor_name, *std::move(made)).first;
          if (pieces) (*start)[tensor_name] = base;
        }
        status = made.status();
      }
      if (status.ok()) status = it->second.Append(added);
      if (!status.ok()) {
        return absl::Status(
            absl::IsResourceExhausted(status) ? status.code()
                                              : absl::StatusCode::kInternal,
            absl::StrCat(name, "/", file, ": cannot keep its rows on disk (",
                         status.message(), ")"));
      }
    }
    ++model->appended_files;
  }
  for (const auto& [tensor_name, tensor] : *grown) {
    auto base = start->find(tensor_name);
    model->tensors[tensor_name] =
        base == start->end() ? tensor.View()
                             : ConcatenatedRows({base->second, tensor.View()});
    // Some rows are a copy: mapped, but not the files' own pages.
    model->weights_mapped = false;
    if (!tensor.on_disk()) {
      log(absl::StrCat("'", name, "': the rows appended to ", tensor_name,
                       " are held in memory, ", tensor.why_in_memory()));
    }
  }
  // The rows evicted: the newest record's count, and at least what the
  // model's max_rows window leaves out of the rows appended.
  Eviction eviction;
  std::string where = absl::StrCat(name, "/config.pbtxt");
  if (!evictions.empty()) {
    const std::string& file = evictions.rbegin()->second;
    absl::StatusOr<std::string> evicted = fs.ReadFile(folder + file, 1 << 16);
    if (!evicted.ok()) return failed(file, evicted.status());
    where = absl::StrCat(name, "/", file);
    absl::StatusOr<Eviction> recorded = ParseEviction(*evicted);
    // A record written while the base was (it names the base before)
    // counts the rows evicted before the base's first row too.
    if (recorded.ok() && recorded->base != model->base_file) {
      if (model->base_file > 0 && recorded->base == previous_base &&
          recorded->rows >= previous_evicted) {
        recorded->rows -= previous_evicted;
      } else {
        recorded = absl::InvalidArgumentError(absl::StrCat(
            "counts from base ", recorded->base, ", not from the model's ",
            model->base_file == 0 ? std::string("weights.safetensors")
                                  : weights_name));
      }
    }
    if (!recorded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", recorded.status().message()));
    }
    eviction = *std::move(recorded);
  }
  ASSIGN_OR_RETURN(const int64_t max_rows, MaxRowsOf(name, *model));
  if (max_rows > 0 && !grown->empty()) {
    const int64_t rows = model->tensors.at(grown->begin()->first).shape[0];
    if (rows - max_rows > eviction.rows) {
      eviction.rows = rows - max_rows;
      if (eviction.tensors.empty()) {
        for (const auto& [tensor_name, tensor] : *grown) {
          eviction.tensors.push_back(tensor_name);
        }
      }
    }
  }
  if (eviction.rows > 0) {
    RETURN_IF_ERROR(
        DropOldestRows(where, eviction.tensors, eviction.rows, model.get()));
  }
  if (check) RETURN_IF_ERROR(check(name, *model));
  model->held_memory = std::make_shared<const attn::HeldMemory>(name);
  model->lineage = std::make_shared<const int>(0);
  model->folder_version = std::make_shared<const int>(0);
  return std::shared_ptr<const RepositoryModel>(std::move(model));
}

// A leftover of an interrupted save: ".<name>.tmp-<id>" (a new version being
// written, or the old one after the exchange) or ".<name>.old-<id>" (the old
// version moved aside where there is no exchange). Sets `model` to <name>.
bool IsLeftover(const std::string& entry, std::string* model, bool* old) {
  if (entry.size() < 2 || entry[0] != '.') return false;
  for (const char* kind : {".tmp-", ".old-"}) {
    const size_t at = entry.find(kind);
    if (at == std::string::npos) continue;
    const std::string name = entry.substr(1, at - 1);
    const std::string id = entry.substr(at + 5);
    if (!ValidName(name) || id.empty() ||
        id.find_first_not_of("0123456789-") != std::string::npos) {
      continue;
    }
    *model = name;
    *old = kind[1] == 'o';
    return true;
  }
  return false;
}

// Writes a new file `path` with what `contents` hands to its writer, in
// as many pieces as it likes, then fsyncs and closes it; the first error.
// With `sync_every`, it also fsyncs each time that many more bytes were
// written: a large file's dirty pages never pile up, so the fsyncs of
// others (appends) on the same file system do not wait behind them all.
absl::Status WriteDurably(
    FileSystem& fs, const std::string& path,
    absl::FunctionRef<absl::Status(
        absl::FunctionRef<absl::Status(absl::string_view)>)>
        contents,
    int64_t sync_every = 0) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.NewWritableFile(path));
  int64_t unsynced = 0;
  absl::Status status = contents([&](absl::string_view piece) {
    RETURN_IF_ERROR(file->Append(piece));
    unsynced += static_cast<int64_t>(piece.size());
    if (sync_every > 0 && unsynced >= sync_every) {
      unsynced = 0;
      return file->Sync();
    }
    return absl::OkStatus();
  });
  if (status.ok()) status = file->Sync();
  absl::Status closed = file->Close();
  return status.ok() ? closed : status;
}

absl::Status WriteDurably(FileSystem& fs, const std::string& path,
                          absl::string_view bytes) {
  return WriteDurably(
      fs, path,
      [&](absl::FunctionRef<absl::Status(absl::string_view)> write) {
        return write(bytes);
      });
}

// The answer for a save of `name` that failed at `step` with the file
// system's `status`: its code kept where it tells the client what to do
// (RESOURCE_EXHAUSTED, FAILED_PRECONDITION), INTERNAL otherwise.
absl::Status SaveError(absl::string_view field, const std::string& name,
                       absl::string_view step, const absl::Status& status) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  std::string why;
  if (absl::IsResourceExhausted(status)) {
    code = absl::StatusCode::kResourceExhausted;
    why = " (the model repository's file system is full)";
  } else if (absl::IsFailedPrecondition(status)) {
    code = absl::StatusCode::kFailedPrecondition;
    why = " (the model repository is read-only or not writable by the server)";
  } else if (absl::IsNotFound(status)) {
    code = absl::StatusCode::kFailedPrecondition;
    why = " (the model repository folder is gone)";
  }
  return absl::Status(code, absl::StrCat(field, " '", name, "': ", step, ": ",
                                         status.message(), why,
                                         "; the model is unchanged"));
}

}  // namespace

void ModelRepository::Log(const std::string& note) const {
  if (log_) {
    log_(note);
  } else {
    absl::FPrintF(stderr, "attnserve: model repository: %s\n", note);
  }
}

std::vector<std::string> ModelRepository::Folders() const {
  std::vector<std::string> names;
  absl::StatusOr<std::vector<FileSystem::Entry>> entries = fs_->ListDir(dir_);
  if (!entries.ok()) return names;
  for (const FileSystem::Entry& entry : *entries) {
    if (entry.name[0] != '.' && entry.is_dir) names.push_back(entry.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void ModelRepository::CleanUpLeftovers(absl::Duration older_than) const {
  absl::StatusOr<std::vector<FileSystem::Entry>> entries = fs_->ListDir(dir_);
  if (!entries.ok()) return;
  // Newest first, so that a model folder missing after a crash gets its
  // latest version back.
  std::sort(entries->begin(), entries->end(),
            [](const FileSystem::Entry& a, const FileSystem::Entry& b) {
              return a.modified > b.modified;
            });
  std::set<std::string> present;
  for (const FileSystem::Entry& entry : *entries) {
    if (entry.name[0] != '.') present.insert(entry.name);
  }
  const absl::Time now = absl::Now();
  for (const FileSystem::Entry& entry : *entries) {
    std::string model;
    bool old = false;
    if (!IsLeftover(entry.name, &model, &old)) continue;
    const std::string path = dir_ + "/" + entry.name;
    if (old && present.count(model) == 0) {
      // Moved aside by a save (no RENAME_EXCHANGE) that died before the new
      // version took its place: the old version comes back.
      absl::Status status = fs_->Rename(path, dir_ + "/" + model);
      if (status.ok()) status = fs_->SyncDir(dir_);
      if (status.ok()) {
        present.insert(model);
        Log(absl::StrCat("put back '", model, "' from ", entry.name,
                         ", left by an interrupted save"));
      } else {
        Log(absl::StrCat("cannot put back '", model, "' from ", entry.name,
                         ": ", status.message()));
      }
      continue;
    }
    if (now - entry.modified < older_than) {
      Log(absl::StrCat("ignored ", entry.name,
                       ": a save in progress, or left by one that was "
                       "interrupted; removed once it is ",
                       absl::FormatDuration(older_than), " old"));
      continue;
    }
    const absl::Status removed = RemoveTree(*fs_, path);
    if (removed.ok()) {
      Log(absl::StrCat("removed ", entry.name, ", left by an interrupted save"));
    } else {
      Log(absl::StrCat("cannot remove ", entry.name,
                       " (left by an interrupted save; ignored): ",
                       removed.message()));
    }
  }
  // Files an interrupted append, eviction or compaction left under their
  // hidden names (.rows-<n>.safetensors.tmp-<id>, .evicted-<n>.tmp-<id>,
  // .base-<k>.safetensors.tmp-<id>): never read, removed once old enough.
  for (const std::string& model : Folders()) {
    absl::StatusOr<std::vector<FileSystem::Entry>> files =
        fs_->ListDir(dir_ + "/" + model);
    if (!files.ok()) continue;
    for (const FileSystem::Entry& file : *files) {
      if (file.is_dir ||
          !(absl::StartsWith(file.name, ".rows-") ||
            absl::StartsWith(file.name, ".evicted-") ||
            absl::StartsWith(file.name, ".base-")) ||
          now - file.modified < older_than) {
        continue;
      }
      const std::string where = absl::StrCat(model, "/", file.name);
      const absl::Status removed =
          fs_->RemoveFile(absl::StrCat(dir_, "/", where));
      Log(removed.ok()
              ? absl::StrCat("removed ", where,
                             ", left by an interrupted append, eviction or "
                             "compaction")
              : absl::StrCat("cannot remove ", where,
                             " (left by an interrupted append, eviction or "
                             "compaction; ignored): ",
                             removed.message()));
    }
  }
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Load(
    const std::string& dir) {
  Options options;
  options.dir = dir;
  return Load(options);
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Load(
    const Options& options) {
  FileSystem* fs = options.file_system != nullptr ? options.file_system
                                                  : DefaultFileSystem();
  std::unique_ptr<ModelRepository> repository(new ModelRepository(options, fs));
  if (options.dir.empty()) return repository;
  absl::StatusOr<std::vector<FileSystem::Entry>> listed =
      fs->ListDir(options.dir);
  if (!listed.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "--model_repository ", options.dir, ": cannot open the folder (",
        listed.status().message(), ")"));
  }
  repository->CleanUpLeftovers(options.remove_leftovers_after);
  for (const std::string& name : repository->Folders()) {
    std::map<std::string, GrowingTensor> grown;
    std::map<std::string, StoredTensor> start;
    std::vector<std::string> covered;
    absl::StatusOr<std::shared_ptr<const RepositoryModel>> model =
        ReadModel(*fs, options.dir, name, options.check_model,
                  options.max_model_bytes, options.max_grown_model_bytes,
                  options.map_weights,
                  [&](const std::string& note) { repository->Log(note); },
                  options.grows_in_pieces, &grown, &start, &covered);
    absl::MutexLock write(&repository->write_mu_);
    if (model.ok()) repository->RemoveCovered(name, covered);
    absl::MutexLock lock(&repository->mu_);
    if (model.ok()) {
      repository->KeepGrowth(name, *model, std::move(grown), std::move(start),
                             0);
      repository->models_[name] = *std::move(model);
    } else if (options.fail_on_model_error) {
      return absl::Status(model.status().code(),
                          absl::StrCat("--model_repository ", options.dir, ": ",
                                       model.status().message()));
    } else {
      repository->Log(absl::StrCat("not serving '", name,
                                   "': ", model.status().message()));
      repository->unloaded_[name].reason =
          absl::StrCat("failed to load: ", model.status().message());
    }
  }
  return repository;
}

absl::Status ModelRepository::LoadModel(const std::string& name) {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        "the server runs without --model_repository");
  }
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_name: '", name, "' must be 1-128 letters, digits, '_' or '-'"));
  }
  absl::MutexLock write(&write_mu_);
  absl::StatusOr<FileSystem::Entry> folder = fs_->Stat(dir_ + "/" + name);
  if (!folder.ok() || !folder->is_dir) {
    return absl::NotFoundError(absl::StrCat(
        "model_name: no folder '", name, "' in the model repository"));
  }
  std::map<std::string, GrowingTensor> grown;
  std::map<std::string, StoredTensor> start;
  std::vector<std::string> covered;
  absl::StatusOr<std::shared_ptr<const RepositoryModel>> model =
      ReadModel(*fs_, dir_, name, check_model_, max_model_bytes_,
                max_grown_model_bytes_, map_weights_,
                [this](const std::string& note) { Log(note); },
                grows_in_pieces_, &grown, &start, &covered);
  if (model.ok()) {
    KeepGrowth(name, *model, std::move(grown), std::move(start), 0);
    RemoveCovered(name, covered);
  }
  absl::MutexLock lock(&mu_);
  if (!model.ok()) {
    // What serves stays (a half-copied folder never takes a model away),
    // and the index says why it is not the folder's version.
    if (models_.count(name) != 0) {
      reload_failures_[name] = absl::StrCat(
          "failed to reload, the version loaded before still serves: ",
          model.status().message());
    } else {
      unloaded_[name].reason =
          absl::StrCat("failed to load: ", model.status().message());
    }
    return absl::Status(model.status().code(),
                        absl::StrCat("failed to load '", name,
                                     "': ", model.status().message()));
  }
  models_[name] = *std::move(model);
  unloaded_.erase(name);
  reload_failures_.erase(name);
  return absl::OkStatus();
}

absl::Status ModelRepository::UnloadModel(const std::string& name) {
  absl::MutexLock write(&write_mu_);
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(
        absl::StrCat("model_name: '", name, "' is not loaded"));
  }
  unloaded_[name] = Unloaded{it->second, "unloaded"};
  models_.erase(it);
  growth_.erase(name);
  reload_failures_.erase(name);
  return absl::OkStatus();
}

std::vector<ModelRepository::ModelState> ModelRepository::Index() const {
  std::vector<std::string> names = Folders();
  absl::MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) names.push_back(name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<ModelState> states;
  for (const std::string& name : names) {
    ModelState state{name, "READY", ""};
    if (models_.count(name) != 0) {
      auto failure = reload_failures_.find(name);
      if (failure != reload_failures_.end()) state.reason = failure->second;
    } else {
      auto it = unloaded_.find(name);
      if (it == unloaded_.end()) {
        state.state = "UNAVAILABLE";
        state.reason = "not loaded";
      } else if (!it->second.model.expired()) {
        state.state = "UNLOADING";
        state.reason = "unloaded; calls that hold it are finishing";
      } else {
        state.state = "UNAVAILABLE";
        state.reason = it->second.reason;
      }
    }
    states.push_back(std::move(state));
  }
  return states;
}

std::shared_ptr<const RepositoryModel> ModelRepository::Find(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second;
}

std::vector<std::string> ModelRepository::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, model] : models_) names.push_back(name);
  return names;
}

absl::Status ModelRepository::WriteModelFolder(absl::string_view field,
                                               const std::string& name,
                                               RepositoryModel* written) {
  const RepositoryModel& model = *written;
  const std::string folder = dir_ + "/" + name;
  // What could not be read back is not written. Bytes the tensors were
  // parsed from are that already, and are written as they are; tensors are
  // written piece by piece from where they lie (a grown memory's mapped
  // rows too), never whole in memory.
  const int64_t weights_size =
      model.weights_file != nullptr
          ? static_cast<int64_t>(model.weights_file->bytes().size())
          : SafetensorsSize(model.tensors);
  if (weights_size > max_model_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, " '", name, "': weights.safetensors would hold ",
        weights_size, " bytes, over the limit of ", max_model_bytes_,
        " (--max_model_bytes); the model is unchanged"));
  }
  // A fresh hidden folder; a name taken (a leftover of an earlier process
  // with this pid, as in a container) is skipped.
  std::string id;
  std::string temporary;
  absl::Status status;
  for (int attempt = 0; attempt < 100; ++attempt) {
    id = absl::StrCat(getpid(), "-", ++saves_);
    temporary = absl::StrCat(dir_, "/.", name, ".tmp-", id);
    status = fs_->CreateDir(temporary);
    if (!absl::IsAlreadyExists(status)) break;
  }
  if (!status.ok()) return SaveError(field, name, "creating a folder", status);
  // Until the new folder takes the model's place, a failure removes it
  // (best effort: what is left is a leftover, ignored and removed by Load).
  auto abandon = [&](absl::string_view step, const absl::Status& failure) {
    RemoveTree(*fs_, temporary).IgnoreError();
    return SaveError(field, name, step, failure);
  };
  std::string config_text;
  google::protobuf::TextFormat::PrintToString(model.config, &config_text);
  status = WriteDurably(
      *fs_, temporary + "/weights.safetensors",
      [&](absl::FunctionRef<absl::Status(absl::string_view)> write) {
        return model.weights_file != nullptr
                   ? write(model.weights_file->bytes())
                   : WriteSafetensors(model.tensors, write);
      });
  if (!status.ok()) return abandon("writing weights.safetensors", status);
  status = WriteDurably(*fs_, temporary + "/config.pbtxt", config_text);
  if (!status.ok()) return abandon("writing config.pbtxt", status);
  status = fs_->SyncDir(temporary);
  if (!status.ok()) return abandon("syncing the new folder", status);

  absl::StatusOr<FileSystem::Entry> existing = fs_->Stat(folder);
  if (!existing.ok() && !absl::IsNotFound(existing.status())) {
    return abandon("looking for the model's folder", existing.status());
  }
  // Where the old version went: `temporary` after an exchange, or its own
  // hidden name where the file system cannot exchange.
  std::string aside;
  if (!existing.ok()) {
    status = fs_->Rename(temporary, folder);
    if (!status.ok()) return abandon("moving the new folder into place", status);
  } else {
    status = fs_->Exchange(temporary, folder);
    if (status.ok()) {
      aside = temporary;
    } else if (absl::IsUnimplemented(status)) {
      aside = absl::StrCat(dir_, "/.", name, ".old-", id);
      status = fs_->Rename(folder, aside);
      if (!status.ok()) return abandon("moving the old folder aside", status);
      status = fs_->Rename(temporary, folder);
      if (!status.ok()) {
        fs_->Rename(aside, folder).IgnoreError();
        return abandon("moving the new folder into place", status);
      }
    } else {
      return abandon("exchanging the old and new folders", status);
    }
  }
  status = fs_->SyncDir(dir_);
  if (!status.ok()) {
    // Answered as a failure, so the old version must be the one in place.
    if (aside.empty()) {
      fs_->Rename(folder, temporary).IgnoreError();
    } else if (aside == temporary) {
      fs_->Exchange(temporary, folder).IgnoreError();
    } else {
      fs_->Rename(folder, temporary).IgnoreError();
      fs_->Rename(aside, folder).IgnoreError();
    }
    fs_->SyncDir(dir_).IgnoreError();
    return abandon("syncing the repository folder", status);
  }
  // Committed. The old version is garbage now; Load removes it if this
  // does not.
  if (!aside.empty()) RemoveTree(*fs_, aside).IgnoreError();
  written->stored_bytes = weights_size;
  written->base_bytes = weights_size;
  written->base_file = 0;
  written->folder_version = std::make_shared<const int>(0);
  written->appended_files = 0;
  written->last_rows_file = 0;
  written->last_eviction_file = 0;
  written->evicted_rows = 0;
  written->evicted_bytes = 0;
  return absl::OkStatus();
}

void ModelRepository::ServeFromWrittenFile(const std::string& name,
                                           RepositoryModel* model) {
  absl::StatusOr<std::shared_ptr<const FileBytes>> file = fs_->MapFile(
      dir_ + "/" + name + "/weights.safetensors", max_model_bytes_);
  if (!file.ok() || !(*file)->why_copied().empty()) return;
  absl::StatusOr<std::map<std::string, StoredTensor>> mapped =
      ParseSafetensorsShared(*std::move(file));
  if (!mapped.ok() || mapped->size() != model->tensors.size()) return;
  // Served only if it holds exactly what was written.
  auto same_bytes = [](const StoredTensor& written, const StoredTensor& held) {
    absl::string_view bytes = written.bytes();
    for (const StoredTensor& part : held.parts()) {
      if (!absl::ConsumePrefix(&bytes, part.bytes())) return false;
    }
    return bytes.empty();
  };
  for (const auto& [tensor_name, tensor] : model->tensors) {
    auto it = mapped->find(tensor_name);
    if (it == mapped->end() || it->second.shape != tensor.shape ||
        it->second.is_bfloat16() != tensor.is_bfloat16() ||
        !same_bytes(it->second, tensor)) {
      return;
    }
  }
  model->tensors = *std::move(mapped);
  model->weights_mapped = true;
  model->weights_file = nullptr;
}

absl::Status ModelRepository::SaveModel(const SaveNames& names,
                                        const std::string& name,
                                        RepositoryModel model) {
  const std::string& field = names.field;
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": the server runs without --model_repository"));
  }
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", name, "' must be 1-128 letters, digits, '_' or '-'"));
  }
  if (check_model_) RETURN_IF_ERROR(check_model_(name, model));
  const std::string backend = model.config.backend();
  // Disk and memory change together, one save (or load) at a time.
  absl::MutexLock write(&write_mu_);
  if (auto existing = Find(name);
      existing != nullptr && existing->config.backend() != backend) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", name, "' is a ", existing->config.backend(),
        " model; pick another name"));
  }
  // A folder of that name that is not served (it failed to load, or was
  // unloaded) is replaced only if it holds a model of the same backend: a
  // save never destroys another model's files.
  if (Find(name) == nullptr && fs_->Stat(dir_ + "/" + name).ok()) {
    inference::ModelConfig config;
    absl::StatusOr<std::string> text =
        fs_->ReadFile(dir_ + "/" + name + "/config.pbtxt");
    if (!text.ok() ||
        !google::protobuf::TextFormat::ParseFromString(*text, &config) ||
        config.backend() != backend) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", name, "' is a folder of the repository that holds no ",
          names.holding, " (backend '", config.backend(),
          "'); pick another name"));
    }
  }
  RETURN_IF_ERROR(WriteModelFolder(field, name, &model));
  growth_.erase(name);
  Serve(name, std::move(model));
  return absl::OkStatus();
}

absl::Status ModelRepository::ReplaceModel(
    const SaveNames& names, const std::string& name,
    const std::function<absl::StatusOr<RepositoryModel>(
        const RepositoryModel&)>& change) {
  absl::MutexLock write(&write_mu_);
  std::shared_ptr<const RepositoryModel> current = Find(name);
  if (current == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        names.field, ": no model '", name, "' is served"));
  }
  ASSIGN_OR_RETURN(RepositoryModel model, change(*current));
  model.weights_file = nullptr;
  model.lineage = nullptr;
  if (check_model_) RETURN_IF_ERROR(check_model_(name, model));
  RETURN_IF_ERROR(WriteModelFolder(names.field, name, &model));
  growth_.erase(name);
  Serve(name, std::move(model));
  return absl::OkStatus();
}

void ModelRepository::Serve(const std::string& name, RepositoryModel model) {
  if (map_weights_ && model.appended_files == 0 && model.evicted_rows == 0 &&
      model.base_file == 0) {
    ServeFromWrittenFile(name, &model);
  }
  model.held_memory = std::make_shared<const attn::HeldMemory>(name);
  if (model.lineage == nullptr) model.lineage = std::make_shared<const int>(0);
  auto stored = std::make_shared<const RepositoryModel>(std::move(model));
  absl::MutexLock lock(&mu_);
  models_[name] = std::move(stored);
  unloaded_.erase(name);
  reload_failures_.erase(name);
}

void ModelRepository::KeepGrowth(
    const std::string& name,
    const std::shared_ptr<const RepositoryModel>& model,
    std::map<std::string, GrowingTensor> grown,
    std::map<std::string, StoredTensor> start, int64_t first_row) {
  if (grown.empty()) {
    growth_.erase(name);  // its buffers must not outlive what they served
  } else {
    growth_[name] = Growth{model, std::move(grown), std::move(start), first_row};
  }
}

absl::Status ModelRepository::WriteIntoFolder(absl::string_view field,
                                              const std::string& name,
                                              const std::string& file,
                                              absl::string_view bytes) {
  const std::string folder = dir_ + "/" + name;
  const std::string path = folder + "/" + file;
  // Written under a hidden name, so a file with its own name is whole: a
  // kill before the rename leaves a leftover that loads never read (and
  // Load removes), never a partial file.
  const std::string temporary =
      absl::StrCat(folder, "/.", file, ".tmp-", getpid(), "-", ++saves_);
  absl::Status status = WriteDurably(*fs_, temporary, bytes);
  if (!status.ok()) {
    fs_->RemoveFile(temporary).IgnoreError();
    return SaveError(field, name, absl::StrCat("writing ", file), status);
  }
  status = fs_->Rename(temporary, path);
  if (!status.ok()) {
    fs_->RemoveFile(temporary).IgnoreError();
    return SaveError(field, name, absl::StrCat("naming ", file), status);
  }
  status = fs_->SyncDir(folder);
  if (!status.ok()) {
    // Answered as a failure, so the file must not be found after a crash.
    fs_->RemoveFile(path).IgnoreError();
    fs_->SyncDir(folder).IgnoreError();
    return SaveError(field, name, "syncing its folder", status);
  }
  return absl::OkStatus();
}

absl::Status ModelRepository::WriteRowsFile(const std::string& name,
                                            uint64_t number, const Rows& rows,
                                            int64_t* bytes) {
  const std::string serialized = SerializeSafetensors(rows);
  *bytes = static_cast<int64_t>(serialized.size());
  return WriteIntoFolder("append", name,
                         NumberedFileName(kRowsPrefix, number, kRowsSuffix),
                         serialized);
}

absl::StatusOr<std::shared_ptr<const RepositoryModel>>
ModelRepository::ServedForChange(absl::string_view field,
                                 const std::string& name, bool may_be_new) {
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": the server runs without --model_repository"));
  }
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: '", name, "' must be 1-128 letters, digits, '_' or '-'"));
  }
  std::shared_ptr<const RepositoryModel> current = Find(name);
  if (current != nullptr) return current;
  if (fs_->Stat(dir_ + "/" + name).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "name: model '", name,
        "' has a folder in the repository but is not served (unloaded, "
        "or it failed to load: the repository index says which); load it "
        "first"));
  }
  if (may_be_new) return current;
  return absl::NotFoundError(
      absl::StrCat("name: no model '", name, "' in the model repository"));
}

absl::StatusOr<ModelRepository::Appended> ModelRepository::AppendRows(
    const AppendRequest& request) {
  const std::string& name = request.name;
  absl::MutexLock write(&write_mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<const RepositoryModel> current,
                   ServedForChange("append", name,
                                   static_cast<bool>(request.create)));
  if (current == nullptr) {
    ASSIGN_OR_RETURN(RepositoryModel model, request.create());
    if (check_model_) RETURN_IF_ERROR(check_model_(name, model));
    RETURN_IF_ERROR(WriteModelFolder("append", name, &model));
    growth_.erase(name);
    Appended appended;
    appended.rows = model.tensors.begin()->second.shape[0];
    appended.files = 1;
    Serve(name, std::move(model));
    return appended;
  }
  ASSIGN_OR_RETURN(const Rows rows, request.prepare(*current));
  ASSIGN_OR_RETURN(const int64_t added,
                   CheckRowsExtend("append", current->tensors, rows));
  int64_t row_bytes = 0;
  for (const auto& [tensor_name, tensor] : rows) {
    row_bytes += tensor.byte_size();
  }
  if (current->stored_bytes + row_bytes > max_grown_model_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "append '", name, "': the model's files would hold over ",
        current->stored_bytes + row_bytes, " bytes, over the limit of ",
        max_grown_model_bytes_,
        " (--max_grown_model_bytes); the model is unchanged"));
  }
  // The rows are copied into tensors that grow in place (on disk, in
  // scratch files of the model's folder, when models are mapped) while the
  // version served is the one the last append made; a version saved or
  // loaded since starts them afresh from what it serves (its rows after
  // any evicted). They are written there first, past the end of every
  // view served, so that a failure (a full disk) leaves what is served and
  // what is on disk as they were: the tensors are then dropped, and the
  // next append starts afresh.
  // A model held in pieces copies only the rows after its first piece
  // (none after a load or a save): that piece serves where it lies.
  Growth& growth = growth_[name];
  if (growth.version.lock() != current) {
    growth.tensors.clear();
    growth.start.clear();
    growth.first_row = current->evicted_rows;
  }
  const bool pieces = grows_in_pieces_ && grows_in_pieces_(*current);
  const GrowingTensor::OnDisk on_disk{fs_, dir_ + "/" + name};
  absl::Status staged;
  for (const auto& [tensor_name, tensor] : rows) {
    auto it = growth.tensors.find(tensor_name);
    if (it == growth.tensors.end()) {
      const StoredTensor& served = current->tensors.at(tensor_name);
      const int64_t kept_in_place =
          pieces ? served.parts().front().shape[0] : 0;
      absl::StatusOr<GrowingTensor> made = GrowingTensor::Create(
          DropRows(served, kept_in_place), max_grown_model_bytes_,
          map_weights_ ? &on_disk : nullptr);
      if (!made.ok()) {
        staged = made.status();
        break;
      }
      if (pieces) growth.start[tensor_name] = served.parts().front();
      it = growth.tensors.emplace(tensor_name, *std::move(made)).first;
      if (!it->second.on_disk()) {
        Log(absl::StrCat("'", name, "': the rows appended to ", tensor_name,
                         " are held in memory, ",
                         it->second.why_in_memory()));
      }
    }
    staged = it->second.Append(tensor);
    if (!staged.ok()) break;
  }
  int64_t file_bytes = 0;
  absl::Status written =
      staged.ok() ? WriteRowsFile(name, current->last_rows_file + 1, rows,
                                  &file_bytes)
                  : SaveError("append", name, "keeping its rows on disk",
                              staged);
  if (!written.ok()) {
    growth_.erase(name);
    return written;
  }

  // Committed on disk: the served version grows.
  RepositoryModel grown = *current;
  Appended appended;
  appended.first_row = current->tensors.at(rows.begin()->first).shape[0];
  for (const auto& [tensor_name, tensor] : rows) {
    grown.tensors[tensor_name] = DropRows(
        growth.Rows(tensor_name), current->evicted_rows - growth.first_row);
  }
  appended.rows = appended.first_row + added;
  // The max_rows window: the oldest rows beyond it go with this append. A
  // load leaves out the same rows (it applies the window to what the files
  // hold), so no record is written for them.
  ASSIGN_OR_RETURN(const int64_t max_rows, MaxRowsOf(name, *current));
  if (max_rows > 0 && appended.rows > max_rows) {
    appended.evicted = appended.rows - max_rows;
    std::vector<std::string> windowed;
    for (const auto& [tensor_name, tensor] : rows) windowed.push_back(tensor_name);
    RETURN_IF_ERROR(
        DropOldestRows("append", windowed, appended.evicted, &grown));
    grown.lineage = nullptr;  // its rows moved: a new lineage
    appended.first_row =
        std::max<int64_t>(0, appended.first_row - appended.evicted);
    appended.rows = max_rows;
  }
  grown.weights_mapped = false;
  grown.weights_file = nullptr;
  grown.stored_bytes += file_bytes;
  ++grown.appended_files;
  ++grown.last_rows_file;
  appended.files = 1 + grown.appended_files;
  Serve(name, std::move(grown));
  growth.version = Find(name);
  MaybeCompact(name, *growth.version.lock());
  return appended;
}

absl::StatusOr<ModelRepository::Evicted> ModelRepository::EvictRows(
    const EvictRequest& request) {
  const std::string& name = request.name;
  absl::MutexLock write(&write_mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<const RepositoryModel> current,
                   ServedForChange("evict", name, /*may_be_new=*/false));
  ASSIGN_OR_RETURN(const std::vector<std::string> tensors,
                   request.row_tensors(*current));
  const int64_t rows = current->tensors.at(tensors.front()).shape[0];
  if (request.oldest < 1 || request.oldest >= rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "oldest: ", request.oldest, " must be in [1, ", rows - 1,
        "]: model '", name, "' holds ", rows,
        " rows and keeps at least one (unload it to serve none)"));
  }
  // What will serve is made first: nothing can fail after the record.
  RepositoryModel kept = *current;
  RETURN_IF_ERROR(DropOldestRows("evict", tensors, request.oldest, &kept));
  kept.weights_file = nullptr;
  kept.lineage = nullptr;  // its rows moved: a new lineage
  ++kept.last_eviction_file;
  RETURN_IF_ERROR(WriteIntoFolder(
      "evict", name,
      NumberedFileName(kEvictedPrefix, kept.last_eviction_file, ""),
      SerializeEviction(
          Eviction{kept.evicted_rows, kept.base_file, tensors})));
  // The record before it says less; loads read the highest only (one left
  // by a failed removal is never read).
  if (current->last_eviction_file > 0) {
    fs_->RemoveFile(absl::StrCat(
                        dir_, "/", name, "/",
                        NumberedFileName(kEvictedPrefix,
                                         current->last_eviction_file, "")))
        .IgnoreError();
  }
  // The growing memory, if any, stays the evicted version's: appends go on
  // growing it, and the rows evicted are released with it.
  Growth* growth = nullptr;
  if (auto it = growth_.find(name);
      it != growth_.end() && it->second.version.lock() == current) {
    growth = &it->second;
  }
  Serve(name, std::move(kept));
  std::shared_ptr<const RepositoryModel> served = Find(name);
  if (growth != nullptr) growth->version = served;
  MaybeCompact(name, *served);
  return Evicted{request.oldest, rows - request.oldest};
}

absl::StatusOr<ModelRepository::Compacted> ModelRepository::CompactRows(
    const std::string& name) {
  // The version to write, read under the lock; its tensors are immutable
  // views, so they are written outside it while appends go on.
  std::shared_ptr<const RepositoryModel> snapshot;
  uint64_t base_file = 0;
  std::string folder;
  std::string temporary;
  // The growing tensors to copy afresh, without the rows evicted from their
  // front: only once those are at least as many as the rows served, so the
  // copy costs O(1) per row appended.
  std::vector<std::string> regrow;
  {
    absl::MutexLock write(&write_mu_);
    ASSIGN_OR_RETURN(snapshot,
                     ServedForChange("compact", name, /*may_be_new=*/false));
    if (snapshot->appended_files == 0 && snapshot->evicted_rows == 0) {
      return Compacted{};
    }
    if (!compacting_.insert(name).second) {
      return absl::AbortedError(
          absl::StrCat("compact '", name, "': a compaction of it is running"));
    }
    if (auto it = growth_.find(name);
        it != growth_.end() && it->second.version.lock() == snapshot &&
        !it->second.tensors.empty()) {
      const int64_t evicted = snapshot->evicted_rows - it->second.first_row;
      const int64_t served =
          snapshot->tensors.at(it->second.tensors.begin()->first).shape[0];
      if (evicted > 0 && evicted >= served) {
        for (const auto& [tensor_name, tensor] : it->second.tensors) {
          regrow.push_back(tensor_name);
        }
      }
    }
    base_file = snapshot->base_file + 1;
    folder = absl::StrCat(dir_, "/", name);
    temporary = absl::StrCat(
        folder, "/.", NumberedFileName(kBasePrefix, base_file, kRowsSuffix),
        ".tmp-", getpid(), "-", ++saves_);
  }
  const std::string file =
      NumberedFileName(kBasePrefix, base_file, kRowsSuffix);
  const SafetensorsMetadata metadata = {
      {std::string(kBaseRowsFiles), absl::StrCat(snapshot->last_rows_file)},
      {std::string(kBaseEvictions),
       absl::StrCat(snapshot->last_eviction_file)},
      {std::string(kBasePrevious), absl::StrCat(snapshot->base_file)},
      {std::string(kBasePreviousEvicted),
       absl::StrCat(snapshot->evicted_rows)}};
  absl::Status status = WriteDurably(
      *fs_, temporary,
      [&](absl::FunctionRef<absl::Status(absl::string_view)> write) {
        return WriteSafetensors(
            snapshot->tensors,
            [&](absl::string_view piece) {
              if (cancel_compactions_.load(std::memory_order_relaxed)) {
                return absl::CancelledError("the repository is closing");
              }
              return write(piece);
            },
            metadata);
      },
      kCompactionSyncBytes);
  // The fresh copies, from the same immutable views, still outside the lock;
  // where one cannot be made (a full disk) the old ones serve on.
  std::map<std::string, GrowingTensor> fresh;
  if (status.ok()) {
    const GrowingTensor::OnDisk on_disk{fs_, folder};
    for (const std::string& tensor_name : regrow) {
      absl::StatusOr<GrowingTensor> made = GrowingTensor::Create(
          snapshot->tensors.at(tensor_name), max_grown_model_bytes_,
          map_weights_ ? &on_disk : nullptr);
      if (!made.ok()) {
        fresh.clear();
        break;
      }
      fresh.emplace(tensor_name, *std::move(made));
    }
  }

  Compacted compacted;
  std::vector<std::string> covered;
  {
    absl::MutexLock write(&write_mu_);
    compacting_.erase(name);
    if (!status.ok()) {
      fs_->RemoveFile(temporary).IgnoreError();
      return SaveError("compact", name, absl::StrCat("writing ", file), status);
    }
    // Committed only over the files it was written from (the same folder).
    // Eviction records written since count from the base before, which the
    // new one's metadata names, with the rows evicted before its first.
    std::shared_ptr<const RepositoryModel> current = Find(name);
    if (current == nullptr ||
        current->folder_version != snapshot->folder_version) {
      fs_->RemoveFile(temporary).IgnoreError();
      return absl::AbortedError(absl::StrCat(
          "compact '", name,
          "': the model was saved, reloaded or unloaded while its base was "
          "written; the model is unchanged"));
    }
    status = fs_->Rename(temporary, absl::StrCat(folder, "/", file));
    if (!status.ok()) {
      fs_->RemoveFile(temporary).IgnoreError();
      return SaveError("compact", name, absl::StrCat("naming ", file), status);
    }
    status = fs_->SyncDir(folder);
    if (!status.ok()) {
      // Answered as a failure: the eviction records to come count from the
      // old base, so the new one must not be found after a crash.
      fs_->RemoveFile(absl::StrCat(folder, "/", file)).IgnoreError();
      fs_->SyncDir(folder).IgnoreError();
      return SaveError("compact", name, "syncing its folder", status);
    }

    // Durable. The version served now (it may have grown since the snapshot)
    // starts from the new base: the same rows, counted from there.
    compacted.compacted = true;
    compacted.base_file = base_file;
    compacted.rows_files = snapshot->appended_files;
    compacted.evicted_rows = snapshot->evicted_rows;
    compacted.bytes = SafetensorsSize(snapshot->tensors, metadata);
    RepositoryModel rebased = *current;
    rebased.base_file = base_file;
    rebased.base_bytes = compacted.bytes;
    rebased.stored_bytes =
        compacted.bytes + (current->stored_bytes - snapshot->stored_bytes);
    rebased.appended_files = current->appended_files - snapshot->appended_files;
    rebased.evicted_rows = current->evicted_rows - snapshot->evicted_rows;
    rebased.evicted_bytes = current->evicted_bytes - snapshot->evicted_bytes;
    auto growth = growth_.find(name);
    if (growth != growth_.end() && growth->second.version.lock() != current) {
      growth = growth_.end();
    }
    // The fresh copies catch up with the rows appended since the snapshot
    // and serve from now on: the rows moved, so the version is a new
    // memory for batching and the GPU's copy.
    bool moved = !fresh.empty() && growth != growth_.end();
    for (auto& [tensor_name, copy] : fresh) {
      if (!moved) break;
      const StoredTensor& now = current->tensors.at(tensor_name);
      const int64_t added =
          (current->evicted_rows + now.shape[0]) -
          (snapshot->evicted_rows + snapshot->tensors.at(tensor_name).shape[0]);
      // (More appended than it serves: the copy holds none of them; the old
      // files serve on, and the next compaction copies afresh.)
      moved = added <= 0 || (added <= now.shape[0] &&
                             copy.Append(DropRows(now, now.shape[0] - added))
                                 .ok());
    }
    if (moved) {
      for (auto& [tensor_name, copy] : fresh) {
        rebased.tensors[tensor_name] =
            DropRows(copy.View(), rebased.evicted_rows);
        compacted.rows_moved = copy.rows();
      }
      rebased.lineage = std::make_shared<const int>(0);
      rebased.held_memory = std::make_shared<const attn::HeldMemory>(name);
      growth->second.tensors = std::move(fresh);
      growth->second.start.clear();
      growth->second.first_row = 0;
    } else if (growth != growth_.end()) {
      growth->second.first_row -= snapshot->evicted_rows;
    }
    // Published as the same memory where no row moved (its held identity
    // and lineage kept), and the appends' tensors stay its own.
    auto published =
        std::make_shared<const RepositoryModel>(std::move(rebased));
    if (growth != growth_.end()) growth->second.version = published;
    {
      absl::MutexLock lock(&mu_);
      models_[name] = published;
    }

    // What the base covers is garbage now; a load skips any left (a failed
    // removal, a kill), and the next compaction removes it.
    absl::StatusOr<NumberedFiles> numbered = ListNumberedFiles(*fs_, folder);
    if (!numbered.ok()) return compacted;
    covered = TakeCoveredFiles(*numbered, base_file, snapshot->last_rows_file,
                               snapshot->last_eviction_file);
    covered.push_back(std::string(kWeightsFile));
  }
  // Removed a few at a time under the write lock, so that appends wait
  // for no more than those (thousands of removals took 0.3 s), and only
  // while the folder is the one compacted: after a whole save, its names
  // are another version's files.
  constexpr size_t kRemovedAtOnce = 32;
  for (size_t at = 0; at < covered.size(); at += kRemovedAtOnce) {
    absl::MutexLock write(&write_mu_);
    std::shared_ptr<const RepositoryModel> now = Find(name);
    if (now == nullptr || now->folder_version != snapshot->folder_version) {
      return compacted;
    }
    for (size_t i = at; i < std::min(covered.size(), at + kRemovedAtOnce);
         ++i) {
      fs_->RemoveFile(absl::StrCat(folder, "/", covered[i])).IgnoreError();
    }
  }
  fs_->SyncDir(folder).IgnoreError();
  return compacted;
}

void ModelRepository::RemoveCovered(const std::string& name,
                                    const std::vector<std::string>& covered) {
  if (covered.empty()) return;
  int removed = 0;
  for (const std::string& file : covered) {
    removed += fs_->RemoveFile(absl::StrCat(dir_, "/", name, "/", file)).ok();
  }
  fs_->SyncDir(absl::StrCat(dir_, "/", name)).IgnoreError();
  Log(absl::StrCat("'", name, "': removed ", removed, " of ", covered.size(),
                   " files its base covers, left by an interrupted "
                   "compaction"));
}

bool ModelRepository::CompactionDue(const RepositoryModel& model) const {
  const int64_t rows_bytes = model.stored_bytes - model.base_bytes;
  return model.appended_files >= compaction_.max_rows_files ||
         (model.appended_files >= compaction_.min_rows_files &&
          rows_bytes >= model.base_bytes) ||
         (model.evicted_bytes > 0 &&
          2 * model.evicted_bytes >= model.stored_bytes);
}

void ModelRepository::MaybeCompact(const std::string& name,
                                   const RepositoryModel& model) {
  if (!compaction_.in_background || !CompactionDue(model)) return;
  absl::MutexLock lock(&compact_mu_);
  if (stopping_ || std::find(compact_queue_.begin(), compact_queue_.end(),
                             name) != compact_queue_.end()) {
    return;
  }
  compact_queue_.push_back(name);
  if (!compactor_.joinable()) {
    compactor_ = std::thread([this] { CompactQueued(); });
  }
}

void ModelRepository::CompactQueued() {
  while (true) {
    std::string name;
    {
      absl::MutexLock lock(&compact_mu_);
      compact_mu_.Await(absl::Condition(
          +[](ModelRepository* repository) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
               repository->compact_mu_) {
            return repository->stopping_ || !repository->compact_queue_.empty();
          },
          this));
      if (stopping_) return;
      name = compact_queue_.front();
      compact_queue_.pop_front();
    }
    // Queued while the compaction before ran, it may have folded what made
    // this one due.
    if (std::shared_ptr<const RepositoryModel> model = Find(name);
        model == nullptr || !CompactionDue(*model)) {
      continue;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<Compacted> compacted = CompactRows(name);
    const absl::Duration took = absl::Now() - start;
    if (compacted.ok() && !compacted->compacted) continue;
    if (compacted.ok()) {
      Log(absl::StrFormat(
          "'%s': compacted %d rows files and %d evicted rows into %s "
          "(%d bytes) in %s",
          name, compacted->rows_files, compacted->evicted_rows,
          NumberedFileName(kBasePrefix, compacted->base_file, kRowsSuffix),
          compacted->bytes, absl::FormatDuration(took)));
    } else {
      Log(absl::StrCat("'", name, "': compaction failed (",
                       compacted.status().ToString(),
                       "); its files stay as they are"));
    }
    if (compaction_.on_done)
      compaction_.on_done(name, compacted.status(), took);
  }
}

ModelRepository::~ModelRepository() {
  std::thread compactor;
  {
    absl::MutexLock lock(&compact_mu_);
    stopping_ = true;
    compactor = std::move(compactor_);
  }
  cancel_compactions_.store(true, std::memory_order_relaxed);
  if (compactor.joinable()) compactor.join();
}

}  // namespace attnserve
