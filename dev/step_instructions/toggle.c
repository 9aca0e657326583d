/* callgrind client requests: count instructions only between cg_start and cg_stop (dev/step_instructions) */
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(void) { CALLGRIND_DUMP_STATS_AT("steps"); CALLGRIND_STOP_INSTRUMENTATION; }
