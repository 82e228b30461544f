# Included by build.sh after llama.cpp's top-level project() (CMAKE_PROJECT_INCLUDE): at the end
# of the configure step, the host-side C++ libraries of llama-server (llama, its common
# library and mtmd) are compiled as unity builds (several .cpp files a
# translation unit), which roughly halves their compile time on a small machine: their files
# share heavy headers (nlohmann/json, cpp-httplib, the STL). ggml, where the kernels are, is
# compiled file by file as usual. Same compiler flags (-O3 -march=native) either way.
if(NOT CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
  return()
endif()
function(loops_llamabench_unity)
  foreach(t llama llama-common mtmd)
    if(TARGET ${t})
      set_target_properties(${t} PROPERTIES UNITY_BUILD ON)
    endif()
  endforeach()
  # common/json.cpp specialises templates that other files of common instantiate.
  if(TARGET llama-common)
    set_source_files_properties(${CMAKE_SOURCE_DIR}/common/json.cpp DIRECTORY ${CMAKE_SOURCE_DIR}/common PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
  # mtmd-helper*.cpp refuse to be compiled after mtmd's internal headers (an #error).
  if(TARGET mtmd)
    set_source_files_properties(${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp
      ${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp DIRECTORY ${CMAKE_SOURCE_DIR}/tools/mtmd
      PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL loops_llamabench_unity)
