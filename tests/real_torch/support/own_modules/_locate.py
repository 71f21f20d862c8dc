NAME = "the program's _locate"
