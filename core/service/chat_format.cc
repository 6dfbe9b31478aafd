#include "core/service/chat_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/gguf/gguf.h"
#include "core/model/gguf_weight_source.h"
#include "core/text/chat_template.h"
#include "core/text/gguf_chat_template.h"

namespace kvguard::core {

absl::StatusOr<std::string> ReadChatTemplateFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("--chat-template ", path, ": cannot open: ", std::strerror(errno)));
  }
  std::string text;
  struct stat st;
  absl::Status status;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat("--chat-template ", path, ": not a file"));
  } else if (static_cast<size_t>(st.st_size) > kMaxChatTemplateFileBytes) {
    status = absl::InvalidArgumentError(absl::StrCat("--chat-template ", path, ": ", st.st_size,
                                                     " bytes, over the limit of ",
                                                     kMaxChatTemplateFileBytes));
  } else {
    // One byte more than the limit, in case the file grew since fstat.
    text.resize(kMaxChatTemplateFileBytes + 1);
    size_t got = 0;
    for (ssize_t n = 0; got < text.size(); got += static_cast<size_t>(n)) {
      n = read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) {
        n = 0;
        continue;
      }
      if (n <= 0) {
        if (n < 0) {
          status = absl::InternalError(
              absl::StrCat("--chat-template ", path, ": read: ", std::strerror(errno)));
        }
        break;
      }
    }
    text.resize(got);
    if (status.ok() && got > kMaxChatTemplateFileBytes) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "--chat-template ", path, ": over the limit of ", kMaxChatTemplateFileBytes, " bytes"));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

absl::StatusOr<ChatFormat> LoadChatFormat(const std::string& model,
                                          const std::string& template_file) {
  ChatFormat format;
  std::optional<std::string> source;
  std::string origin;  // what the errors name
  if (IsGgufPath(model)) {
    absl::StatusOr<std::unique_ptr<gguf::File>> file = gguf::File::Open(model);
    if (!file.ok()) return file.status();
    absl::StatusOr<GgufChatTemplate> from_gguf = ReadGgufChatTemplate(**file);
    if (!from_gguf.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(model, ": ", from_gguf.status().message()));
    }
    source = std::move(from_gguf->source);
    format.bos_token = std::move(from_gguf->bos_token);
    format.eos_token = std::move(from_gguf->eos_token);
    origin = absl::StrCat(model, ": tokenizer.chat_template");
  }
  if (!template_file.empty()) {
    absl::StatusOr<std::string> text = ReadChatTemplateFile(template_file);
    if (!text.ok()) return text.status();
    source = *std::move(text);
    origin = absl::StrCat("--chat-template ", template_file);
  }
  if (!source.has_value()) return format;
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(*source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.status().message()));
  }
  format.chat_template = std::make_shared<const ChatTemplate>(*std::move(parsed));
  return format;
}

}  // namespace kvguard::core
