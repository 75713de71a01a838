# Replays one golden trace with `meshnet kv replay` and diffs the result with
# the expected output. Inputs: MESHNET, TRACE, EXPECTED, APPEND_PATH, OUT.
execute_process(
  COMMAND ${MESHNET} kv replay --append-path ${APPEND_PATH}
  INPUT_FILE ${TRACE}
  OUTPUT_FILE ${OUT}
  ERROR_VARIABLE err
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "meshnet kv replay exited with ${rc} on ${TRACE}:\n${err}")
endif()
file(READ ${EXPECTED} expected)
file(READ ${OUT} actual)
if(NOT expected STREQUAL actual)
  execute_process(COMMAND diff -u ${EXPECTED} ${OUT} OUTPUT_VARIABLE d)
  message(FATAL_ERROR "output of ${TRACE} (append path ${APPEND_PATH}) differs from "
                      "${EXPECTED}:\n${d}")
endif()
message(STATUS "${TRACE}: identical to the expected output")
