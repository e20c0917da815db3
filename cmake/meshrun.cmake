# meshrun_library(<target> SOURCES ... DEPS ...)
# Defines library target meshrun_<target> with alias meshrun::<alias>, where <alias> is
# <target> with "_" replaced by "::" (e.g. worker_sparse -> meshrun::worker::sparse).
function(meshrun_library target)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(meshrun_${target} ${ARG_SOURCES})
  target_include_directories(meshrun_${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(meshrun_${target} PUBLIC ${ARG_DEPS})
  string(REPLACE "_" "::" alias ${target})
  add_library(meshrun::${alias} ALIAS meshrun_${target})
endfunction()

# meshrun_test(<name> SOURCES ... DEPS ... LABELS ... [TIMEOUT seconds])
# A GoogleTest executable registered with ctest; LABELS name the capability
# (foundation, runtime, coordinator, worker, telemetry, sparse, e2e, fault, load)
# and "unit" for tests that run under the sanitizer build.
function(meshrun_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT MESHRUN_BUILD_TESTS)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
