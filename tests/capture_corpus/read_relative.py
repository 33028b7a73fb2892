with open("corpus_helper.py") as handle:
    print(len(handle.read().splitlines()))
