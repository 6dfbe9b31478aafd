// kvguard-testserver: `kvguard serve` linked with the fault-injection variants, for the
// end-to-end tests (tests/service/). Same flags; the admin API adds POST /admin/test/abort-next
// (a fault for the next request of a tenant) and POST /admin/test/pace (Engine::Allow).
#include <string>
#include <vector>

#include "tools/commands.h"

int main(int argc, char** argv) {
  return kvguard::tools::RunServe(std::vector<std::string>(argv + 1, argv + argc));
}
