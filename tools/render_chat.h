// tools/render_chat.h: `kvguard model render-chat`, the chat prompt a model's template makes
// of a request's messages (core/text/chat_template.h).
#ifndef KVGUARD_TOOLS_RENDER_CHAT_H_
#define KVGUARD_TOOLS_RENDER_CHAT_H_

#include <string>
#include <vector>

namespace kvguard::tools {

// RunRenderChat takes the arguments after `render-chat`; returns 0 (the prompt printed on
// stdout, nothing else), 1 (the template or an input refused, the reason on stderr) or 2
// (usage).
int RunRenderChat(const std::vector<std::string>& argv);

}  // namespace kvguard::tools

#endif  // KVGUARD_TOOLS_RENDER_CHAT_H_
