// tools/commands.h: the subcommands of the one `kvguard` binary.
//
// Each Run* takes the arguments after its own name and returns the process exit code:
// 0 on success, 1 when the work failed, 2 on a usage error (with a message on stderr).
#ifndef KVGUARD_TOOLS_COMMANDS_H_
#define KVGUARD_TOOLS_COMMANDS_H_

#include <string>
#include <vector>

namespace kvguard::tools {

int RunVersion(const std::vector<std::string>& args);
int RunBench(const std::vector<std::string>& args);
int RunGenerate(const std::vector<std::string>& args);
int RunBenchEngine(const std::vector<std::string>& args);
int RunBenchIsolation(const std::vector<std::string>& args);
int RunBenchGpu(const std::vector<std::string>& args);
int RunBenchPrefill(const std::vector<std::string>& args);
int RunKeys(const std::vector<std::string>& args);
int RunAudit(const std::vector<std::string>& args);
int RunEval(const std::vector<std::string>& args);
int RunModel(const std::vector<std::string>& args);
int RunModelTokenize(const std::vector<std::string>& args);  // `kvguard model tokenize`
int RunServe(const std::vector<std::string>& args);
int RunTenant(const std::vector<std::string>& args);

// BuildDescription returns the multi-line text `kvguard version` prints (also written into
// benchmark result files, so a figure always says what produced it).
std::string BuildDescription();

// CpuModel returns the CPU model name from /proc/cpuinfo, or "unknown".
std::string CpuModel();

// UtcNow returns the time as "YYYY-MM-DD HH:MM:SS UTC", for result files.
std::string UtcNow();

// WriteFile replaces `path` with `text`; on failure it says so on stderr and returns false.
bool WriteFile(const std::string& path, const std::string& text);

}  // namespace kvguard::tools

#endif  // KVGUARD_TOOLS_COMMANDS_H_
