# Diagnosis: the sample ring and the rules over synthetic series, then each
# rule end to end (real gpumemd, real client processes producing each case,
# real gpumemctl diagnose/top/status), in both heap modes.
add_executable(gm-diag-workload ${CMAKE_CURRENT_LIST_DIR}/diag_workload.c)
target_link_libraries(gm-diag-workload PRIVATE gm_testutil gpumem gm_ipc)

add_executable(test_diagnose ${CMAKE_CURRENT_LIST_DIR}/test_diagnose.c ${CMAKE_SOURCE_DIR}/ctl/diagnose.c
  ${CMAKE_SOURCE_DIR}/ctl/json_read.c)
target_include_directories(test_diagnose PRIVATE ${CMAKE_SOURCE_DIR}/ctl)
target_link_libraries(test_diagnose PRIVATE gm_testutil gm_allocator gm_common PkgConfig::CHECK)
target_compile_definitions(test_diagnose PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GM_DIAG_WORKLOAD="$<TARGET_FILE:gm-diag-workload>" GM_TEST_CLIENT="$<TARGET_FILE:gm-test-client>")
add_dependencies(test_diagnose gpumemd gpumemctl gm-diag-workload gm-test-client)
add_test(NAME diagnose_host COMMAND test_diagnose)
set_tests_properties(diagnose_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=central" TIMEOUT 600)
add_test(NAME diagnose_host_local COMMAND test_diagnose)
set_tests_properties(diagnose_host_local PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=local"
                     TIMEOUT 600)
# On the cuda backend over the emulated driver (a fresh device pool per test):
# there the pending free is a real library client's, on a real stream.
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  add_dependencies(test_diagnose fakecuda)
  foreach(mode central local)
    set(leg diagnose_cuda)
    if(mode STREQUAL "local")
      set(leg diagnose_cuda_local)
    endif()
    add_test(NAME ${leg} COMMAND test_diagnose)
    set_tests_properties(${leg} PROPERTIES TIMEOUT 600 ENVIRONMENT
      "GPUMEM_TEST_BACKEND=cuda;GPUMEM_HEAP=${mode};GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};FAKECUDA_CAPACITY=4G;FAKECUDA_CONTEXT_BYTES=0")
  endforeach()
endif()
