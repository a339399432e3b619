// The model repository: a folder per named model, each holding its
// configuration (config.pbtxt, an inference.ModelConfig in protobuf text
// format) and its weights (weights.safetensors, float32 tensors).
//
// The repository stores bytes: what a model of each `backend` must hold is
// the models layer's to say (server/models/model_kinds.h), through the
// check it gives in Options, run on every model loaded or saved. The folder
// name must equal the config's `name`.
//
// Load validates everything at start-up and fails with a message naming the
// file and the problem (or, without fail_on_model_error, lists the broken
// model as UNAVAILABLE with that message). SaveModel writes a model
// crash-safely and makes it servable at once:
// - both files go into a fresh hidden folder `.<name>.tmp-<id>`, each
//   fsynced, then the folder is fsynced;
// - that folder then takes the model folder's place in one step: rename(2)
//   for a new name, renameat2(RENAME_EXCHANGE) over an existing one (the old
//   folder, now under the hidden name, is removed after), and the
//   repository folder is fsynced before the answer;
// - where the file system has no RENAME_EXCHANGE (NFS), the old folder is
//   first renamed to `.<name>.old-<id>` and put back by the next Load if a
//   crash came before the new one took its place.
// A kill at any instant leaves each model its old complete folder or its
// new complete one; the hidden leftovers are never loaded, and Load removes
// them (docs/repository.md).
//
// A model may also grow by rows (AppendRows): each append is one more file
// in its folder, rows-<n>.safetensors, written under a hidden name, fsynced,
// renamed into place and the folder fsynced before the answer; a load reads
// weights.safetensors and then every rows file in the order of <n>, which
// extend its tensors along their first dimension. EvictRows drops a
// model's oldest rows by writing a small file the same way, evicted-<n>:
// the rows evicted since the base it names (weights.safetensors, or a
// compaction's base-<k>) and the tensors they are dropped from, which a
// load applies (the highest <n>) after the rows files. A model whose config sets `max_rows` keeps only its newest rows
// that many (MaxRowsOf): an append drops the oldest beyond it, and a load
// leaves them out of what its files hold. A whole save replaces the
// folder, rows files and all. CompactRows folds a model's rows files and
// eviction records into one file, base-<k>.safetensors, written while the
// model serves and named only once durable; a load starts from the
// highest base instead of weights.safetensors and skips the files it
// covers (its header's metadata says which). docs/repository.md gives the
// layout and why a kill at any instant leaves every acknowledged append
// and no partial one.
//
// Live model control (Triton's model_repository extension): LoadModel reads
// a folder again (a new or changed model) and serves it; UnloadModel stops
// serving one. Models are shared_ptrs: a call that found a model holds it
// until it is done, so an unloaded or replaced model finishes its calls in
// flight with the weights they started with, and is freed after the last.
//
// Thread-safe: lookups (Find, Names, Index) may run concurrently with
// SaveModel, LoadModel and UnloadModel, which run one at a time in the
// order they take the repository's write lock. Messages name models and
// files relative to the repository, never the server's folders (but Load's
// own failure, which only the operator sees, names the repository folder).
#ifndef ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
#define ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attn/held_memory.h"
#include "attn/tensor.h"
#include "inference/model_config.pb.h"
#include "server/repository/file_system.h"
#include "server/repository/growing_tensor.h"
#include "server/repository/safetensors.h"
#include "server/repository/stored_tensor.h"

namespace attnserve {

struct RepositoryModel {
  inference::ModelConfig config;
  // Weights by name, each with its shape.
  std::map<std::string, StoredTensor> tensors;
  // True when the tensors are views of the weights file's pages, mapped
  // under a lease (server/repository/mapped_file.h); false when they are
  // the process's own copy (a model made in memory, Options::map_weights
  // off, or a file that could not be mapped, which Load logs).
  bool weights_mapped = false;
  // The safetensors bytes the tensors were parsed from, when they came that
  // way (an upload): SaveModel writes them as they are instead of
  // serializing the tensors again, so a save costs no copy of the weights.
  // Null: the tensors are serialized. Dropped once the model serves from its
  // written file.
  std::shared_ptr<const FileBytes> weights_file;
  // The tensors' identity across calls, for a device that keeps its own
  // copy of a stored memory (attn/held_memory.h): made when the model is
  // read or saved, and gone with the last reference to this version, so a
  // replaced or unloaded version's device copy goes once its calls end.
  std::shared_ptr<const attn::HeldMemory> held_memory;
  // The bytes of its files in the repository (weights.safetensors or its
  // base, and its rows files), which --max_grown_model_bytes bounds; 0 for a
  // model not stored. base_bytes of them are the file its rows start from.
  int64_t stored_bytes = 0;
  int64_t base_bytes = 0;
  // The <k> of the base-<k>.safetensors its rows start from (0:
  // weights.safetensors), so that the next is named without listing.
  uint64_t base_file = 0;
  // The files in its folder as a whole save or a load left them: shared by
  // every version grown from that one by appends, evictions and
  // compactions, and made anew by the next save or load. A compaction
  // commits only while the version served has the same.
  std::shared_ptr<const void> folder_version;
  // The rows files appended since its base (AppendRows), and
  // the highest <n> of them and of its eviction records in its folder
  // (0: none), so that the next of each is named without listing it.
  int64_t appended_files = 0;
  uint64_t last_rows_file = 0;
  uint64_t last_eviction_file = 0;
  // Shared by the versions of a model that grew from this one by appends
  // alone, each holding the rows of the one before in the same places: a
  // batch may read the newest of them for calls on any
  // (server/execution/operation.h, StoredRequest::lineage). A load, a
  // save, an eviction, or a compaction that copies the rows afresh starts a
  // new one.
  std::shared_ptr<const void> lineage;
  // The oldest rows evicted since its base (EvictRows, or a max_rows
  // window), which its eviction records count: row 0 served is the row
  // that many after the base's first.
  int64_t evicted_rows = 0;
  // Their bytes, as they were stored (what a compaction would leave out).
  int64_t evicted_bytes = 0;
};

// A model's `max_rows` config parameter (a positive integer; 0 when it
// sets none): the repository keeps at most that many of its rows, dropping
// the oldest as appends come (ModelRepository::AppendRows) and leaving
// them out at load. INVALID_ARGUMENT starting with `where` for any other
// value.
absl::StatusOr<int64_t> MaxRowsOf(const std::string& where,
                                  const RepositoryModel& model);

class ModelRepository {
 public:
  // Checks a model read or about to be saved: OK, or INVALID_ARGUMENT whose
  // message starts with `where` (the model's name).
  using CheckModel = std::function<absl::Status(const std::string& where,
                                                const RepositoryModel& model)>;

  struct Options {
    // The repository folder; empty gives an empty repository (saves and
    // loads then fail with FAILED_PRECONDITION).
    std::string dir;
    // A model folder that cannot be loaded at start-up fails Load (true,
    // Triton's --exit-on-error), or is left unserved and listed by Index as
    // UNAVAILABLE with its reason (false). Leftovers of interrupted saves
    // never count as models.
    bool fail_on_model_error = true;
    // Leftovers of interrupted saves (.<name>.tmp-*, .<name>.old-*) at least
    // this old are removed by Load; younger ones may be another server's
    // save in progress in a shared repository, and are only ignored.
    absl::Duration remove_leftovers_after = absl::Minutes(10);
    // Not owned, must outlive the repository; null: DefaultFileSystem().
    FileSystem* file_system = nullptr;
    // Receives Load's notes (leftovers removed or put back, models skipped);
    // empty: stderr, as "attnserve: model repository: <note>".
    std::function<void(const std::string&)> log;
    // Run on every model loaded or saved (server/models/model_kinds.h's
    // CheckStoredModel); empty: every parseable model is accepted.
    CheckModel check_model;
    // A model whose weights.safetensors holds more bytes is refused
    // (RESOURCE_EXHAUSTED naming the file and --max_model_bytes) before it
    // is read; SaveModel refuses to write one.
    int64_t max_model_bytes = int64_t{2} << 30;
    // The most a model's files may hold together, weights.safetensors and
    // the rows appended to it (AppendRows): an append past it, or a folder
    // holding more, is refused (RESOURCE_EXHAUSTED). Appends are not one
    // message, so this is not bounded by max_model_bytes.
    int64_t max_grown_model_bytes = int64_t{2} << 30;
    // Serve weights files mapped under a lease where the file system and
    // permissions allow (server/repository/mapped_file.h): no copy at
    // load, one copy in RAM for all the processes that map the file. Off,
    // or where a lease is refused, every model is read into the process's
    // own memory. Saved models are served from the file written.
    bool map_weights = true;
    // Whether a model's grown tensors may be held in pieces
    // (StoredTensor::pieces): its base file's rows mapped where they lie,
    // and only the rows appended since copied, at load and on its first
    // append. The models layer says which kinds read pieces
    // (server/models/model_kinds.h); empty: none, every grown tensor is
    // one contiguous copy.
    std::function<bool(const RepositoryModel&)> grows_in_pieces;
    // When CompactRows runs by itself: on a thread of the repository's
    // own, after an append or eviction that leaves a model with at least
    // min_rows_files rows files holding together at least as many bytes
    // as its base (so each row is rewritten about log2 of the model's
    // growth times), with max_rows_files of them (a bound on the files a
    // load reads), or with rows evicted holding at least half of what its
    // files hold. Off: only when called.
    struct Compaction {
      bool in_background = false;
      int64_t min_rows_files = 8;
      int64_t max_rows_files = 4096;
      // Told of each background compaction that did something or failed:
      // the model, the outcome (ABORTED when the model changed under it)
      // and how long it took. Called on the compaction's thread.
      std::function<void(const std::string& model, const absl::Status&,
                         absl::Duration took)>
          on_done;
    };
    Compaction compaction;
  };

  // Lists the folder, restores or removes leftovers of interrupted saves
  // (logged; failures to remove them are logged, never fatal), and loads
  // every model folder. NOT_FOUND without the folder; with
  // fail_on_model_error, the first broken model's error (INVALID_ARGUMENT,
  // NOT_FOUND, ...) naming its file. Blocks on file I/O.
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Load(
      const Options& options);
  // Load with the default Options for `dir`.
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Load(
      const std::string& dir);

  // The model, or null.
  std::shared_ptr<const RepositoryModel> Find(const std::string& name) const;
  std::vector<std::string> Names() const;

  // Reads folder `name` (again) and serves its model, replacing any loaded
  // one. INVALID_ARGUMENT for a bad name or a malformed model (the message
  // names the file; a model already served stays served and Index gives the
  // failure as its reason), NOT_FOUND without such a folder,
  // FAILED_PRECONDITION without a repository folder. Blocks on file I/O and
  // on a save in progress.
  absl::Status LoadModel(const std::string& name);
  // Stops serving `name` (NOT_FOUND if it is not served); calls holding it
  // finish with it.
  absl::Status UnloadModel(const std::string& name);

  // Every model folder and every served model, by name, with Triton's
  // state: READY (served; the reason is empty, or names the failure of the
  // last reload, the version loaded before still serving), UNLOADING
  // (unloaded, calls that hold it still running), UNAVAILABLE (with the
  // reason: unloaded, failed to load, or not loaded yet). Hidden folders
  // (leftovers of saves) are not listed.
  struct ModelState {
    std::string name;
    std::string state;
    std::string reason;
  };
  std::vector<ModelState> Index() const;

  // What a save is called in its messages: the request field that asked
  // for it ("save_as") and what the model holds ("fitted bandwidth").
  struct SaveNames {
    std::string field;
    std::string holding;
  };
  // Writes `model` as `name` durably (files and folders fsynced) and serves
  // it. Saves run one at a time: the last one answered OK is the one on
  // disk and served. On any failure the previous version (or none) stays on
  // disk and in memory, and the message names the field, the model and the
  // failed step, never a server path:
  // - INVALID_ARGUMENT: a bad name, a model the check refuses, or a name
  //   taken by a model of another backend (served, or a folder not served);
  // - RESOURCE_EXHAUSTED: the repository's file system is full (retryable
  //   once space is freed), or the weights would hold more than
  //   max_model_bytes;
  // - FAILED_PRECONDITION: no repository folder, or it is read-only or not
  //   writable by the server (not retryable until that changes);
  // - INTERNAL: any other I/O error (EIO...).
  // Blocks on file I/O (several fsyncs) and on other saves.
  absl::Status SaveModel(const SaveNames& names, const std::string& name,
                         RepositoryModel model);

  // The rows an append adds, by the name of the tensor each extends: [n, ...]
  // with one n >= 1 for all, and the type (F32 or BF16) and dimensions after
  // the first of the stored tensor it extends.
  using Rows = std::map<std::string, StoredTensor>;
  struct AppendRequest {
    std::string name;
    // Makes the rows from the model served now (its kind's check and
    // conversion), under the repository's write lock, so no other change
    // comes between: the rows, or the status the append answers.
    std::function<absl::StatusOr<Rows>(const RepositoryModel&)> prepare;
    // Makes the model when none is served under `name` and the repository
    // has no folder of that name, of the append's rows alone (every tensor
    // [n, ...]): the append then saves it whole, as SaveModel does. Empty:
    // such an append is NOT_FOUND.
    std::function<absl::StatusOr<RepositoryModel>()> create;
  };
  struct Appended {
    // The index of the first row added (0 when the max_rows window left
    // out some of them: the rows held are then the last of them).
    int64_t first_row = 0;
    int64_t rows = 0;     // the rows held after it
    int64_t files = 0;    // files the model is in: 1 + rows files
    int64_t evicted = 0;  // the oldest rows the max_rows window dropped
  };
  // Appends rows to model `name` durably and serves the grown model: every
  // lookup that starts after the answer finds it, and a call holding the
  // version before keeps exactly its rows. Appends, saves, loads and
  // unloads run one at a time, in the order they take the write lock. On any
  // failure nothing on disk or served changes, and the message names the
  // step, never a server path:
  // - what `prepare` or `create` answers (INVALID_ARGUMENT for rows its kind
  //   refuses);
  // - NOT_FOUND: no model `name` and no `create`; FAILED_PRECONDITION: a
  //   folder `name` that is not served (unloaded, or failed to load), or no
  //   repository folder;
  // - RESOURCE_EXHAUSTED: the model's files would hold more than
  //   max_grown_model_bytes, or the file system is full;
  // - SaveModel's codes for the file system's other failures.
  // Blocks on file I/O (two fsyncs) and on other writers.
  absl::StatusOr<Appended> AppendRows(const AppendRequest& request);

  struct EvictRequest {
    std::string name;
    // The oldest rows to drop, >= 1, leaving at least one.
    int64_t oldest = 0;
    // The tensors whose rows these are (the kind's), from the model served
    // now, under the write lock; or the status the eviction answers.
    std::function<absl::StatusOr<std::vector<std::string>>(
        const RepositoryModel&)>
        row_tensors;
  };
  struct Evicted {
    int64_t evicted = 0;  // rows dropped by this call
    int64_t rows = 0;     // rows held after it
  };
  // Drops the `oldest` rows of model `name` durably (an evicted-<n> file
  // written, fsynced, renamed into place and the folder fsynced before the
  // answer) and serves what is left: row i becomes row i - oldest. A call
  // holding the version before keeps its rows. On failure nothing changes;
  // INVALID_ARGUMENT when `oldest` is < 1 or would leave no row, and
  // AppendRows' other statuses (no create: NOT_FOUND for an unknown model).
  absl::StatusOr<Evicted> EvictRows(const EvictRequest& request);

  // Replaces the served model `name` by `change(current)` under the write
  // lock, so that nothing (an append, a save) comes between reading the
  // version and writing its successor; written whole as SaveModel writes
  // (its rows files and eviction records folded into weights.safetensors)
  // and served at once. NOT_FOUND when none is served (naming
  // `names.field`); `change`'s status; SaveModel's statuses.
  absl::Status ReplaceModel(
      const SaveNames& names, const std::string& name,
      const std::function<absl::StatusOr<RepositoryModel>(
          const RepositoryModel&)>& change);

  struct Compacted {
    bool compacted = false;    // false: nothing to fold
    uint64_t base_file = 0;    // the <k> of the base-<k>.safetensors written
    int64_t rows_files = 0;    // rows files it folded
    int64_t evicted_rows = 0;  // evicted rows it left out of the disk
    int64_t bytes = 0;         // the base's size
    // Rows copied into fresh scratch files, leaving behind the rows evicted
    // from the front of those served (0: none moved).
    int64_t rows_moved = 0;
  };
  // Folds model `name`'s rows files and eviction records into one file,
  // base-<k>.safetensors, holding every tensor as the version served when
  // it starts: written under a hidden name outside the write lock (appends,
  // evictions and calls go on meanwhile), fsynced, then, under the lock,
  // renamed into place and the folder fsynced; only then are the files it
  // covers (weights.safetensors, older bases, rows files and eviction
  // records up to the version it wrote) removed. What is served never
  // changes, and a load of the folder at any instant gives the same rows.
  // Where the rows evicted from the front of the appended rows' scratch
  // files are at least as many as the rows served, those are copied into
  // fresh ones too (outside the lock), so a first-in-first-out memory's
  // files do not grow for ever; the version then serves from them, with
  // the same rows but a new identity.
  // Nothing to fold (no rows file, no row evicted): OK, compacted false.
  // An eviction while the base is written stays beside it (its record
  // counts from the base before, which the new base's metadata names).
  // ABORTED, with nothing left, when the model was saved, reloaded or
  // unloaded while the base was written, or another compaction of it is
  // running; AppendRows' statuses for an unknown model
  // and for the file system's failures (the model is then unchanged).
  // Blocks on file I/O, the base's size in writes.
  absl::StatusOr<Compacted> CompactRows(const std::string& name);

  // Stops the background compactions (one running is cancelled at its next
  // write, its hidden file removed).
  ~ModelRepository();

  // Options::max_model_bytes.
  int64_t max_model_bytes() const { return max_model_bytes_; }

 private:
  ModelRepository(const Options& options, FileSystem* fs)
      : dir_(options.dir),
        fs_(fs),
        log_(options.log),
        check_model_(options.check_model),
        max_model_bytes_(options.max_model_bytes),
        max_grown_model_bytes_(options.max_grown_model_bytes),
        map_weights_(options.map_weights),
        grows_in_pieces_(options.grows_in_pieces),
        compaction_(options.compaction) {}

  // Removes files of folder `name` that its base covers (ReadModel skipped
  // them), best effort, and logs it.
  void RemoveCovered(const std::string& name,
                     const std::vector<std::string>& covered)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Whether Options::compaction says `model` is due a compaction.
  bool CompactionDue(const RepositoryModel& model) const;
  // Queues a background compaction of `model`, served as `name`, when
  // it is due.
  void MaybeCompact(const std::string& name, const RepositoryModel& model)
      ABSL_LOCKS_EXCLUDED(compact_mu_);
  // The background compactions' thread.
  void CompactQueued() ABSL_LOCKS_EXCLUDED(compact_mu_);

  // The repository's model folders (not hidden ones), sorted.
  std::vector<std::string> Folders() const;
  // Puts back or removes what interrupted saves left (Load).
  void CleanUpLeftovers(absl::Duration older_than) const;
  void Log(const std::string& note) const;
  // Writes `model` as folder `name`, durably, replacing any (SaveModel),
  // and sets its stored_bytes; failures name `field`.
  absl::Status WriteModelFolder(absl::string_view field,
                                const std::string& name,
                                RepositoryModel* model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // After a save: `model`'s tensors become views of the file just written,
  // where it maps and holds exactly what was written (else it keeps its
  // own copy). The config is left as it is.
  void ServeFromWrittenFile(const std::string& name, RepositoryModel* model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // Serves `model` as `name` (a save or an append just wrote it), with a
  // fresh held-memory identity.
  void Serve(const std::string& name, RepositoryModel model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Writes `bytes` as the new file `file` of folder `name` durably: under a
  // hidden name, fsynced, renamed, the folder fsynced. Nothing is left on
  // failure; failures name `field` and `file`.
  absl::Status WriteIntoFolder(absl::string_view field, const std::string& name,
                               const std::string& file,
                               absl::string_view bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // The model served as `name`, for a change to it: FAILED_PRECONDITION
  // naming `field` without a repository folder, INVALID_ARGUMENT for a bad
  // name, FAILED_PRECONDITION for a folder that is not served, NOT_FOUND
  // (null with OK when `may_be_new` and there is no folder either).
  absl::StatusOr<std::shared_ptr<const RepositoryModel>> ServedForChange(
      absl::string_view field, const std::string& name, bool may_be_new)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Writes `rows` as rows-<number>.safetensors of folder `name`, durably;
  // nothing is left on failure. Its size in *bytes.
  absl::Status WriteRowsFile(const std::string& name, uint64_t number,
                             const Rows& rows, int64_t* bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // What appends grow in place: the served version they last made (or
  // read), and its tensors' buffers. Used while that version is the one
  // served; else the next append starts afresh from the served tensors.
  struct Growth {
    std::weak_ptr<const RepositoryModel> version;
    std::map<std::string, GrowingTensor> tensors;
    // For a model held in pieces (Options::grows_in_pieces): by tensor, the
    // rows `tensors` follow, served where they lie (a base file's mapped
    // rows); the tensors served are these, then `tensors`' rows. Empty:
    // `tensors` hold every row.
    std::map<std::string, StoredTensor> start;
    // The evicted_rows of the version they started from: their row 0.
    int64_t first_row = 0;

    // Every row of tensor `name` grown so far: its start, then its
    // growing tensor's rows.
    StoredTensor Rows(const std::string& name) const {
      auto it = start.find(name);
      StoredTensor grown = tensors.at(name).View();
      return it == start.end() ? grown : ConcatenatedRows({it->second, grown});
    }
  };

  // Keeps what ReadModel grew for `model`, the version about to serve as
  // `name`, for the next append (nothing when it grew nothing).
  void KeepGrowth(const std::string& name,
                  const std::shared_ptr<const RepositoryModel>& model,
                  std::map<std::string, GrowingTensor> grown,
                  std::map<std::string, StoredTensor> start, int64_t first_row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // A model no longer (or never successfully) served, for Index.
  struct Unloaded {
    std::weak_ptr<const RepositoryModel> model;  // expired once freed
    std::string reason;
  };

  const std::string dir_;
  FileSystem* const fs_;
  const std::function<void(const std::string&)> log_;
  const CheckModel check_model_;
  const int64_t max_model_bytes_;
  const int64_t max_grown_model_bytes_;
  const bool map_weights_;
  const std::function<bool(const RepositoryModel&)> grows_in_pieces_;
  const Options::Compaction compaction_;

  // Held by SaveModel, LoadModel and UnloadModel for all their work, so
  // that what is on disk and what is served change together, in one order.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Numbers this process's saves, for unique hidden folder names.
  uint64_t saves_ ABSL_GUARDED_BY(write_mu_) = 0;
  std::map<std::string, Growth> growth_ ABSL_GUARDED_BY(write_mu_);
  // Models a CompactRows is writing a base of now.
  std::set<std::string> compacting_ ABSL_GUARDED_BY(write_mu_);

  // The background compactions: models due, in order, each once.
  absl::Mutex compact_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  std::deque<std::string> compact_queue_ ABSL_GUARDED_BY(compact_mu_);
  bool stopping_ ABSL_GUARDED_BY(compact_mu_) = false;
  std::thread compactor_ ABSL_GUARDED_BY(compact_mu_);
  // Read by a compaction's writes (no lock): the repository is going.
  std::atomic<bool> cancel_compactions_{false};

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const RepositoryModel>> models_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, Unloaded> unloaded_ ABSL_GUARDED_BY(mu_);
  // Why the last reload of a served model failed (it serves on).
  std::map<std::string, std::string> reload_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
