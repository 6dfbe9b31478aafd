// audit/private_file.h: files only this process's user may read: the page-tag key file
// (isolation/tag_key.cc), the log's signing key (audit/signing_key.cc), the log's own files
// (audit/log.cc), and the service's tenants and admin key digest files (ReadPrivateFile). One
// implementation of the checks, the durable writes and the key files' load-or-create that they
// all need.
#ifndef KVGUARD_AUDIT_PRIVATE_FILE_H_
#define KVGUARD_AUDIT_PRIVATE_FILE_H_

#include <sys/stat.h>

#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvguard::audit {

// FdCloser closes a file descriptor when it goes out of scope.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser();
  int get() const { return fd_; }
  // Close returns OK, or the error close(2) reports (which can be a deferred write error).
  absl::Status Close();

 private:
  int fd_;
};

// SecretBuffer is a string that holds key material: its capacity is reserved up front so no
// reallocation leaves a copy behind, and it is cleansed (OPENSSL_cleanse) when destroyed.
class SecretBuffer {
 public:
  explicit SecretBuffer(size_t capacity) { s_.reserve(capacity); }
  SecretBuffer(const SecretBuffer&) = delete;
  SecretBuffer& operator=(const SecretBuffer&) = delete;
  ~SecretBuffer();
  std::string& str() { return s_; }

 private:
  std::string s_;
};

// Prefix returns `s` with "context: " before its message.
absl::Status Prefix(const absl::Status& s, std::string_view context);

// WriteAll writes all of `data` to `fd` (retrying short writes and EINTR), or returns the error.
absl::Status WriteAll(int fd, std::string_view data);

// ReadUpTo reads `fd` to its end into `out` (whose capacity the caller may have reserved);
// OutOfRange once more than `max_bytes` are there.
absl::Status ReadUpTo(int fd, size_t max_bytes, std::string& out);

// FsyncDirectory returns OK once the directory `dir`'s entries are durable; FsyncParentDir
// does that for the directory holding `path`.
absl::Status FsyncDirectory(const std::string& dir);
absl::Status FsyncParentDir(const std::string& path);

// WriteNewPrivateFile returns OK once `contents` is durable in `path`, which it creates
// (O_EXCL|O_NOFOLLOW: AlreadyExists if anything is there) with mode 0600 whatever the umask,
// together with its directory entry. On failure it removes what it created.
absl::Status WriteNewPrivateFile(const std::string& path, std::string_view contents);

// CheckPrivateFile returns OK if `st` (of `path`, described to the user as `what`, e.g. "tag
// key file") is a regular file that grants group and others nothing and belongs to this
// process's user (a 0600 file another user planted is still theirs); FailedPrecondition
// saying which and how to fix it otherwise.
absl::Status CheckPrivateFile(std::string_view what, const std::string& path,
                              const struct stat& st);

// ReadPrivateFile returns the contents of `path` (described to the user as `what`, e.g.
// "tenants file") once it has been opened without following a symbolic link and its fstat has
// passed CheckPrivateFile: the files that decide who may do what (tenants, the admin key's
// digest) get the key files' checks. NotFound if there is no such file, FailedPrecondition for a
// symbolic link or what CheckPrivateFile refuses, InvalidArgument past `max_bytes`, another
// error if it cannot be read. Not for key material (the key files read into a SecretBuffer).
absl::StatusOr<std::string> ReadPrivateFile(std::string_view what, const std::string& path,
                                            size_t max_bytes);
// ReadPrivateFileInto is ReadPrivateFile into `out`, for key material: the caller passes a
// SecretBuffer's string with max_bytes + 1 reserved, so the key is never copied.
absl::Status ReadPrivateFileInto(std::string_view what, const std::string& path, size_t max_bytes,
                                 std::string& out);

// LoadOrCreatePrivateFile is how the key files start: it reads `path` into `out` as
// ReadPrivateFileInto does and returns false; if there is no file, it calls `create(path)`,
// which must write a new one with WriteNewPrivateFile (AlreadyExists if another process got
// there first), and returns true. When another process creates the file between the two, that
// file is read instead (the caller then discards what `create` made). Errors as
// ReadPrivateFileInto's, or `create`'s prefixed with `what`.
absl::StatusOr<bool> LoadOrCreatePrivateFile(
    std::string_view what, const std::string& path, size_t max_bytes, std::string& out,
    absl::FunctionRef<absl::Status(const std::string&)> create);

}  // namespace kvguard::audit

#endif  // KVGUARD_AUDIT_PRIVATE_FILE_H_
