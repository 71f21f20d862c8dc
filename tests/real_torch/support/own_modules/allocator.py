NAME = "the program's allocator module"
