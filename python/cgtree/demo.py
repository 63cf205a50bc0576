def main(argv):
    return 0
