# Claims (issue 27): engines set device memory aside with gpumem_claim() and
# never over-commit it. Real gpumemd, real client processes of their own uids;
# host, and the emulated cuda driver when the build found cuda.h.
add_executable(test_claim ${CMAKE_CURRENT_LIST_DIR}/test_claim.c)
target_link_libraries(test_claim PRIVATE gm_testutil gpumem PkgConfig::CHECK)
target_compile_definitions(test_claim PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>")
add_dependencies(test_claim gpumemd gpumemctl)
add_test(NAME claim_host COMMAND test_claim)
set_tests_properties(claim_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host" TIMEOUT 300)
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  add_dependencies(test_claim fakecuda fakenvml)
  add_test(NAME claim_cuda COMMAND test_claim)
  set_tests_properties(claim_cuda PROPERTIES TIMEOUT 300 ENVIRONMENT
    "GPUMEM_TEST_BACKEND=cuda;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G")
endif()
