#include "audit/private_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "openssl/crypto.h"

namespace kvguard::audit {

FdCloser::~FdCloser() {
  if (fd_ >= 0) close(fd_);
}

absl::Status FdCloser::Close() {
  const int fd = std::exchange(fd_, -1);
  if (close(fd) != 0) return absl::ErrnoToStatus(errno, "close");
  return absl::OkStatus();
}

SecretBuffer::~SecretBuffer() {
  s_.resize(s_.capacity());  // within capacity: no reallocation
  OPENSSL_cleanse(s_.data(), s_.size());
}

absl::Status Prefix(const absl::Status& s, std::string_view context) {
  return absl::Status(s.code(), absl::StrCat(std::string(context), ": ", s.message()));
}

absl::Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::ErrnoToStatus(n < 0 ? errno : EIO, "write");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status ReadUpTo(int fd, size_t max_bytes, std::string& out) {
  out.resize(max_bytes + 1);
  size_t size = 0;
  while (size < out.size()) {
    const ssize_t n = read(fd, out.data() + size, out.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, "read");
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  out.resize(size);  // shrinking keeps the capacity, so nothing is copied
  if (size > max_bytes) {
    return absl::OutOfRangeError(absl::StrCat("larger than ", max_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status FsyncDirectory(const std::string& dir) {
  FdCloser fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open directory ", dir));
  if (fsync(fd.get()) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("fsync ", dir));
  return fd.Close();
}

absl::Status FsyncParentDir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return FsyncDirectory(parent.empty() ? std::string(".") : parent.string());
}

absl::Status WriteNewPrivateFile(const std::string& path, std::string_view contents) {
  FdCloser fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("create ", path));
  absl::Status s;
  // fchmod: the umask may have taken bits off 0600, and the owner needs both.
  if (fchmod(fd.get(), 0600) != 0) s = absl::ErrnoToStatus(errno, "fchmod");
  if (s.ok()) s = WriteAll(fd.get(), contents);
  if (s.ok() && fsync(fd.get()) != 0) s = absl::ErrnoToStatus(errno, "fsync");
  if (s.ok()) s = fd.Close();
  if (!s.ok()) {
    unlink(path.c_str());
    return Prefix(s, path);
  }
  return FsyncParentDir(path);
}

absl::Status CheckPrivateFile(std::string_view what, const std::string& path,
                              const struct stat& st) {
  const std::string w(what);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(w, " ", path, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        w, " ", path, ": mode 0", (st.st_mode >> 6) & 7, (st.st_mode >> 3) & 7, st.st_mode & 7,
        " gives group or others access to the key; it must be 0600 (chmod 600)"));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(w, " ", path, ": owned by uid ", st.st_uid,
                                                      ", not by this process's uid ", geteuid()));
  }
  return absl::OkStatus();
}

absl::Status ReadPrivateFileInto(std::string_view what, const std::string& path, size_t max_bytes,
                                 std::string& out) {
  const std::string w(what);
  // O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it.
  FdCloser fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("cannot read ", w, " ", path));
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat(w, " ", path, ": is a symbolic link; it must be a regular file"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat(w, ": open ", path));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0)
    return absl::ErrnoToStatus(errno, absl::StrCat(w, ": fstat ", path));
  if (absl::Status s = CheckPrivateFile(what, path, st); !s.ok()) return s;
  if (absl::Status s = ReadUpTo(fd.get(), max_bytes, out); !s.ok()) {
    if (absl::IsOutOfRange(s)) {
      return absl::InvalidArgumentError(absl::StrCat(w, " ", path, ": ", s.message()));
    }
    return Prefix(s, absl::StrCat(w, ": read ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPrivateFile(std::string_view what, const std::string& path,
                                            size_t max_bytes) {
  std::string contents;
  if (absl::Status s = ReadPrivateFileInto(what, path, max_bytes, contents); !s.ok()) return s;
  return contents;
}

absl::StatusOr<bool> LoadOrCreatePrivateFile(
    std::string_view what, const std::string& path, size_t max_bytes, std::string& out,
    absl::FunctionRef<absl::Status(const std::string&)> create) {
  const std::string w(what);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(w, ": empty path"));
  // Two rounds: if another process creates the file between our open and our create, load it.
  for (int round = 0; round < 2; ++round) {
    absl::Status read = ReadPrivateFileInto(what, path, max_bytes, out);
    if (read.ok()) return false;
    if (!absl::IsNotFound(read)) return read;
    absl::Status made = create(path);
    if (absl::IsAlreadyExists(made)) continue;
    if (!made.ok()) return Prefix(made, w);
    return true;
  }
  return absl::UnavailableError(
      absl::StrCat(w, " ", path, ": created and removed concurrently; try again"));
}

}  // namespace kvguard::audit
