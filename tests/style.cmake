# The tree follows the committed .clang-format (clang-format from Debian).
find_program(GM_CLANG_FORMAT clang-format REQUIRED)
add_test(NAME format COMMAND ${PROJECT_SOURCE_DIR}/scripts/check-format.sh ${PROJECT_SOURCE_DIR})
