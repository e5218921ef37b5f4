# Allocator statistics, PYTORCH_CUDA_ALLOC_CONF parsing and the trace history.
foreach(suite stats alloc_conf history)
  add_executable(test_alloc_${suite} ${CMAKE_CURRENT_LIST_DIR}/test_${suite}.c)
  target_link_libraries(test_alloc_${suite} PRIVATE gm_allocator PkgConfig::CHECK)
  add_test(NAME allocator_${suite} COMMAND test_alloc_${suite})
endforeach()
