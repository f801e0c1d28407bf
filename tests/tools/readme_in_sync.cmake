# cmake -DREADME=<README.md> -DEXAMPLE=<readme_example.cpp> -P readme_in_sync.cmake
# The README's C++ example is this compiled, tested file, verbatim.
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "${example}" position)
if(position EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim: copy the file into the README's C++ section")
endif()
