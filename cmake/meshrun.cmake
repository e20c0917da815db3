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
  meshrun_check_layering(meshrun_${target})
endfunction()

# meshrun_check_layering(<target>)
# Makes <target>'s build fail when one of its sources, or the header beside one, includes a
# meshrun header from a folder that neither holds the target nor holds a meshrun library the
# target links directly (cmake/check_layering.cmake). So the CMake dependencies are the layering
# rules: a library that may not depend on another cannot include its headers either.
# Checked when the target's dependencies are final (at the end of configuration).
function(meshrun_check_layering target)
  set_property(GLOBAL APPEND PROPERTY MESHRUN_LAYERED_TARGETS ${target})
endfunction()

function(meshrun_folder_of target out)
  get_target_property(aliased ${target} ALIASED_TARGET)
  if(aliased)
    set(target ${aliased})
  endif()
  get_target_property(dir ${target} SOURCE_DIR)
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${dir})
  if(folder STREQUAL "proto")
    set(folder "meshrun/v1")  # generated: #include "meshrun/v1/*.pb.h"
  endif()
  set(${out} ${folder} PARENT_SCOPE)
endfunction()

function(meshrun_add_layering_checks)
  get_property(targets GLOBAL PROPERTY MESHRUN_LAYERED_TARGETS)
  foreach(target IN LISTS targets)
    meshrun_folder_of(${target} own)
    set(folders ${own})
    get_target_property(deps ${target} LINK_LIBRARIES)
    foreach(dep IN LISTS deps)
      if(dep MATCHES "^meshrun[_:]" AND TARGET ${dep})
        meshrun_folder_of(${dep} folder)
        list(APPEND folders ${folder})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES folders)
    get_target_property(dir ${target} SOURCE_DIR)
    get_target_property(sources ${target} SOURCES)
    set(files)
    foreach(source IN LISTS sources)
      if(source MATCHES "\\.cc$" AND NOT IS_ABSOLUTE ${source})
        list(APPEND files ${dir}/${source})
        string(REGEX REPLACE "\\.cc$" ".h" header ${dir}/${source})
        if(EXISTS ${header})
          list(APPEND files ${header})
        endif()
      endif()
    endforeach()
    set(stamp ${CMAKE_BINARY_DIR}/layering/${target}.ok)
    string(REPLACE ";" "\\;" folders_arg "${folders}")
    string(REPLACE ";" "\\;" files_arg "${files}")
    add_custom_command(OUTPUT ${stamp}
      COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -DTARGET=${target}
              "-DFOLDERS=${folders_arg}" "-DFILES=${files_arg}" -DSTAMP=${stamp}
              -P ${PROJECT_SOURCE_DIR}/cmake/check_layering.cmake
      DEPENDS ${files} ${PROJECT_SOURCE_DIR}/cmake/check_layering.cmake
      COMMENT "layering: ${target}")
    add_custom_target(${target}_layering DEPENDS ${stamp})
    add_dependencies(${target} ${target}_layering)
  endforeach()
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
  if(MESHRUN_TSAN)  # abseil's synchronization made visible to TSan (common/tsan_absl_shim.cc)
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/common/tsan_absl_shim.cc)
    target_link_libraries(${name} PRIVATE ${CMAKE_DL_LIBS})
  endif()
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# The three binaries sit together in <build>/bin, as an install puts them in <prefix>/bin: the
# scripts and the multi-process tests take that one folder, and the coordinator finds the
# dashboard in web/ beside it.
function(meshrun_binary target)
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  meshrun_check_layering(${target})
endfunction()
