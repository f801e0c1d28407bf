# cmake -DPROGRAM=<exe> -DARGS="a|b|c" -DEXIT=<code> -DREGEX=<regex> -P expect_exit.cmake
# Runs PROGRAM with ARGS ("|"-separated) and fails unless it exits with EXIT and its
# stdout+stderr match REGEX.
string(REPLACE "|" ";" argument_list "${ARGS}")
execute_process(COMMAND "${PROGRAM}" ${argument_list} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT "${code}" STREQUAL "${EXIT}")
  message(FATAL_ERROR "expected exit code ${EXIT}, got '${code}'")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}'")
endif()
