# The shared libraries other projects link (docs/install.md):
#
#   libkiln_runtime.so   format + runtime + kernels + the C API: loads and
#                        runs packages; never the compiler, ONNX or protobuf
#   libkiln_compiler.so  the compiler, the ONNX importer and run-time shape
#                        specialization, over libkiln_runtime.so
#
# Each is the whole of its layers' static libraries (built position
# independent), linked with a version script (cmake/runtime.map) that
# exports only kiln's API: namespace kiln and the kiln_* C functions. The
# SONAME carries the major and minor version while the major is 0 (a 0.x
# minor may change the C++ API; CHANGELOG.md), the major alone from 1.0.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(KILN_SOVERSION "0.${PROJECT_VERSION_MINOR}")
else()
  set(KILN_SOVERSION "${PROJECT_VERSION_MAJOR}")
endif()
set(KILN_EXPORT_MAP ${CMAKE_CURRENT_LIST_DIR}/runtime.map)

# kiln_shared_library(TARGET OUTPUT_NAME WHOLE static-libs... LINK libs...)
function(kiln_shared_library target output_name)
  cmake_parse_arguments(ARG "" "" "WHOLE;LINK" ${ARGN})
  # A source file of its own: a shared library target needs one.
  add_library(${target} SHARED ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/shared_library.cc)
  # Every object of the WHOLE archives goes in (not only what something
  # uses: this is the library's API); linking the targets again after them
  # brings their usage requirements and dependencies (oneDNN, zstd...).
  # CMake's $<LINK_LIBRARY:WHOLE_ARCHIVE> refuses a target that its
  # dependencies name again, hence the plain linker flags.
  set(archives)
  foreach(library IN LISTS ARG_WHOLE)
    list(APPEND archives $<TARGET_FILE:${library}>)
  endforeach()
  target_link_libraries(${target} PRIVATE ${ARG_LINK} -Wl,--whole-archive ${archives} -Wl,--no-whole-archive
                                          ${ARG_WHOLE})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_link_options(${target} PRIVATE "LINKER:--version-script=${KILN_EXPORT_MAP}" "LINKER:--no-undefined")
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${output_name}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${KILN_SOVERSION}
    LINK_DEPENDS ${KILN_EXPORT_MAP})
endfunction()

kiln_shared_library(kiln_runtime_shared kiln_runtime
  WHOLE kiln_c kiln_runtime kiln_kernels kiln_format kiln_plugins kiln_core)
# The runtime library first on the link line: what it exports is taken
# from it, not linked in a second time from the static libraries.
kiln_shared_library(kiln_compiler_shared kiln_compiler
  WHOLE kiln_specialize kiln_onnx kiln_compiler kiln_training kiln_passes kiln_ops kiln_ir
  LINK kiln_runtime_shared)
set_target_properties(kiln_runtime_shared PROPERTIES EXPORT_NAME runtime)
set_target_properties(kiln_compiler_shared PROPERTIES EXPORT_NAME compiler)
target_link_libraries(kiln_compiler_shared PUBLIC kiln_runtime_shared)
