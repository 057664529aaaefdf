#!/bin/sh
# Runs a unit test binary, under valgrind when the 'valgrind' test setup
# asked for it (MLOOP_VALGRIND=1): any error or definite leak fails.
if [ -n "$MLOOP_VALGRIND" ]; then
    command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed"; exit 77; }
    exec valgrind --quiet --error-exitcode=99 --leak-check=full \
        --errors-for-leak-kinds=definite "$@"
fi
exec "$@"
