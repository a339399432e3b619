// For the repository's tests: real folders under /tmp, and what they hold.
// Test-only; thread-compatible (plain functions over the file system).
#ifndef ATTNSERVE_SERVER_REPOSITORY_TEST_FOLDERS_H_
#define ATTNSERVE_SERVER_REPOSITORY_TEST_FOLDERS_H_

#include <dirent.h>
#include <stdlib.h>

#include <set>
#include <string>

namespace attnserve {

// A fresh, empty folder /tmp/<prefix>-XXXXXX (left for the system to
// clean); empty on failure.
inline std::string TempDir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "-XXXXXX";
  return mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
}

// The names in folder `dir` without "." and ".."; none when it cannot be
// opened.
inline std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  DIR* handle = opendir(dir.c_str());
  if (handle == nullptr) return names;
  while (dirent* entry = readdir(handle)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.insert(name);
  }
  closedir(handle);
  return names;
}

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_TEST_FOLDERS_H_
