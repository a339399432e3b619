// For the repository's tests: real folders under /tmp, what they hold, and
// whether memory is a file's pages.
// Test-only; thread-compatible (plain functions over the file system).
#ifndef ATTNSERVE_SERVER_REPOSITORY_TEST_FOLDERS_H_
#define ATTNSERVE_SERVER_REPOSITORY_TEST_FOLDERS_H_

#include <dirent.h>
#include <stdlib.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
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

// The line of /proc/self/maps whose range holds `address`; empty if none.
inline std::string MappingOf(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    fields >> std::hex >> begin >> dash >> end;
    if (begin <= at && at < end) return line;
  }
  return "";
}

// Whether `address` is in a file's shared pages (a shared mapping with an
// inode), not the process's anonymous memory.
inline bool InFilePages(const void* address) {
  std::istringstream fields(MappingOf(address));
  std::string range, permissions, offset, device;
  int64_t inode = 0;
  fields >> range >> permissions >> offset >> device >> inode;
  return inode != 0 && permissions.size() == 4 && permissions[3] == 's';
}

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REPOSITORY_TEST_FOLDERS_H_
