# Per step: the measured bubble, the prediction fitted to the job's measured costs, and
# the cost model's guess the plan starts with. Call with
#   gnuplot -e "data='bubble.dat'; out='bubble.png'; title_text='...'" bubble.gp
if (!exists("title_text")) title_text = "Bubble: measured and predicted"
set terminal pngcairo size 900,420 font "DejaVu Sans,10"
set output out
set termoption noenhanced
set title title_text
set xlabel "step"
set ylabel "bubble (idle share of stage time)"
set yrange [0:*]
set grid lc rgb "#eeeeee"
set key bottom right box opaque
plot data using 1:2 with linespoints pt 7 ps 0.5 lc rgb "#4C72B0" title "measured", \
     data using 1:3 with lines lw 2 lc rgb "#DD8452" title "predicted from measured costs", \
     data using 1:4 with linespoints pt 5 ps 0.6 lc rgb "#999999" title "cost model (plan)"
