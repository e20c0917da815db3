# cmake -P check_layering.cmake: fails when a file of a target includes a meshrun header from a
# folder the target does not link directly (meshrun_check_layering in meshrun.cmake runs it as
# part of the target's build). Variables:
#   ROOT     the source tree
#   TARGET   the target's name, for the message
#   FOLDERS  ";"-joined folders (relative to ROOT) the target may include: its own and those of
#            the meshrun libraries it links directly; a folder admits its subfolders
#   FILES    ";"-joined absolute paths of the files to check
#   STAMP    written when every include is admitted
cmake_policy(VERSION 3.25)
set(meshrun_roots bundle checkpoint cli common coordinator coordinator_service jobspec meshrun
    proto rpc runtime telemetry testing worker worker_service)
set(bad "")
foreach(file IN LISTS FILES)
  if(NOT EXISTS "${file}")
    continue()
  endif()
  file(STRINGS "${file}" lines REGEX "^#include \"[a-z_]+/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
    string(REGEX REPLACE "/[^/]*$" "" dir "${header}")
    string(REGEX REPLACE "/.*" "" top "${header}")
    if(NOT top IN_LIST meshrun_roots)
      continue()
    endif()
    set(admitted FALSE)
    foreach(folder IN LISTS FOLDERS)
      if(dir STREQUAL folder OR dir MATCHES "^${folder}/")
        set(admitted TRUE)
      endif()
    endforeach()
    if(NOT admitted)
      file(RELATIVE_PATH rel "${ROOT}" "${file}")
      string(APPEND bad "\n  ${rel}: #include \"${header}\"")
    endif()
  endforeach()
endforeach()
if(bad)
  string(REPLACE ";" ", " allowed "${FOLDERS}")
  message(FATAL_ERROR "layering: ${TARGET} includes headers of folders it does not link "
    "(it may include ${allowed}):${bad}\nLink the library that owns the header, if the rules "
    "in docs/layout.md allow it, or move the code to the floor that may use it.")
endif()
file(WRITE "${STAMP}" "ok\n")
