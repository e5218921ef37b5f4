# The tree follows the committed .clang-format (clang-format from Debian).
find_program(GM_CLANG_FORMAT clang-format REQUIRED)
add_test(NAME format COMMAND ${PROJECT_SOURCE_DIR}/scripts/check-format.sh ${PROJECT_SOURCE_DIR})

# The module arrows point one way: no file includes a header from a module above it.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME layers COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check-layers.py ${PROJECT_SOURCE_DIR})
