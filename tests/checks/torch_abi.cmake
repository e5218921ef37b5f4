# libgpumem_torch takes the std::string ABI of the PyTorch GPUMEM_TORCH_DIR
# names (torch/CMakeLists.txt): the tree configured against fake PyTorch
# trees, nothing built (C++ builds only, as the library's C++ part).
if(CMAKE_CXX_COMPILER)
  add_test(NAME torch_abi_configure
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/torch_abi_check.sh ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/torch_abi_configure
            ${CMAKE_COMMAND} ${CMAKE_GENERATOR} ${CMAKE_C_COMPILER} ${CMAKE_CXX_COMPILER})
  set_tests_properties(torch_abi_configure PROPERTIES TIMEOUT 120)
endif()
